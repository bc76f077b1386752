"""b12x-aot compiler: specs in, variants planned, compiled offline and recorded."""
