"""Everything a communicator refuses, checked without a GPU.

The communicator comes from ``fake_communicator``; its tensor hot path is checked in
``test_communicator_tensors``, which needs torch. Also: settings and policy validation, the
peer-agreement checks, the window header, the launcher, and the import budget.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from b12x_aot.comm import (
    CapacityError,
    CommArgumentError,
    CommClosedError,
    CommError,
    CommTimeoutError,
    Communicator,
    PeerMismatchError,
    PeerSetupError,
    Policy,
    RendezvousError,
)
from b12x_aot.comm._device import decode_error
from b12x_aot.comm._policy import Settings, choose_variants, required_keys
from b12x_aot.comm._settings import NO_MULTICAST_ENV, read_launch_env
from b12x_aot.comm._setup import PeerInfo, check_peers, ranks_sharing_device
from b12x_aot.comm._window import header_image, peer_table
from b12x_aot.comm.layout import (
    ERROR_PTR_OFFSET,
    ERROR_TIMEOUT,
    FLAGS_OFFSET,
    MAX_WORLD,
    PEERS_OFFSET,
    TIMEOUT_OFFSET,
)
from b12x_aot.contract import B12xError
from b12x_aot.loader import LoaderError

from .fake_communicator import VA, make, only_call

# --- the raw hot path ---------------------------------------------------------------------------


def test_raw_launch_passes_the_spec_arguments_in_order() -> None:
    comm, launches, _, _ = make()
    comm.all_reduce_raw(0x1000, 0x9000, 64, "bf16", stream=7)
    key, args = only_call(launches)
    assert key == ("bf16", "oneshot", "pull")
    # out, inp, peers, ctrl, rank, num_elements, capacity (elements), stream
    assert args == (0x1000, 0x9000, VA + PEERS_OFFSET, VA, 1, 64, (1 << 20) // 2, 7)


def test_policy_picks_two_shot_from_its_threshold_and_calls_override() -> None:
    comm, launches, _, _ = make(policy=Policy(twoshot_from_bytes=4096, transport="push"))
    comm.all_reduce_raw(0x100000, 0x200000, 2048 - 8, "fp16")
    comm.all_reduce_raw(0x100000, 0x200000, 2048, "fp16")
    comm.all_reduce_raw(0x100000, 0x200000, 2048, "fp16", algorithm="oneshot", transport="pull")
    assert len(launches[("fp16", "oneshot", "push")].calls) == 1
    assert len(launches[("fp16", "twoshot", "push")].calls) == 1
    assert len(launches[("fp16", "oneshot", "pull")].calls) == 1


def test_zero_elements_launch_nothing() -> None:
    comm, launches, _, _ = make()
    comm.all_reduce_raw(0x1000, 0x2000, 0, "bf16")
    assert not any(launch.calls for launch in launches.values())


def test_tails_are_refused() -> None:
    comm, launches, _, _ = make()
    with pytest.raises(CommArgumentError, match=r"multiple of 8 elements.*tails are not supported") as err:
        comm.all_reduce_raw(0x1000, 0x9000, 12, "bf16")
    assert isinstance(err.value, ValueError)
    assert "12 elements" in str(err.value)
    assert not any(launch.calls for launch in launches.values())


def test_payload_over_capacity() -> None:
    comm, _, _, _ = make(capacity=1000)  # rounded up to 1008 bytes
    assert comm.capacity_bytes == 1008
    comm.all_reduce_raw(0x10000, 0x20000, 504, "bf16")
    with pytest.raises(CapacityError, match=r"capacity of 1008 bytes \(got 1024 bytes\)") as err:
        comm.all_reduce_raw(0x10000, 0x20000, 512, "bf16")
    assert isinstance(err.value, ValueError)
    assert "capacity_bytes >= 1024" in str(err.value)


def test_dtype_not_in_the_communicator() -> None:
    comm, _, _, _ = make(dtypes=("bf16",))
    with pytest.raises(CommArgumentError, match=r"dtypes \('bf16',\) \(got 'fp16'\)"):
        comm.all_reduce_raw(0x1000, 0x9000, 8, "fp16")


@pytest.mark.parametrize(
    ("out", "inp", "problem"),
    [
        (0x1008, 0x9000, "16-byte aligned"),
        (0x1000, 0x9004, "16-byte aligned"),
        (0x1000, 0x1000 + 126, "16-byte aligned"),
        (0x1000, 0x1000 + 112, "must be inp itself or not overlap it"),
        (0x1000 + 112, 0x1000, "must be inp itself or not overlap it"),
        (-16, 0x9000, "non-negative int"),
        (4096.0, 0x9000, "non-negative int"),
    ],
)
def test_bad_pointers(out: Any, inp: Any, problem: str) -> None:
    comm, _, _, _ = make()
    with pytest.raises(CommArgumentError, match=problem):
        comm.all_reduce_raw(out, inp, 64, "bf16")


def test_in_place_is_allowed() -> None:
    comm, launches, _, _ = make()
    comm.all_reduce_raw(0x1000, 0x1000, 64, "bf16")
    assert sum(len(launch.calls) for launch in launches.values()) == 1


def test_unknown_or_unbuilt_variant() -> None:
    comm, _, _, _ = make(keys=[("bf16", "oneshot", "pull")])
    with pytest.raises(CommArgumentError, match="algorithm must be one of"):
        comm.all_reduce_raw(0x1000, 0x9000, 8, "bf16", algorithm="threeshot")
    with pytest.raises(CommArgumentError, match="transport must be one of"):
        comm.all_reduce_raw(0x1000, 0x9000, 8, "bf16", transport="carrier-pigeon")
    with pytest.raises(CommArgumentError, match=r"bf16/oneshot/push.*Built: bf16/oneshot/pull"):
        comm.all_reduce_raw(0x1000, 0x9000, 8, "bf16", transport="push")


def test_a_recorded_timeout_is_raised_first_and_every_time_after() -> None:
    comm, launches, words, _ = make()
    words[0] = ERROR_TIMEOUT | 1 << 24 | 3 << 16 | 5
    words[1] = 42
    for _ in range(2):
        with pytest.raises(CommTimeoutError) as err:
            comm.all_reduce_raw(0x1000, 0x9000, 12, "nonsense")  # the timeout wins over bad input
        e = err.value
        assert (e.rank, e.missing_rank, e.barrier, e.block, e.generation) == (1, 3, 1, 5, 42)
        text = str(e)
        for part in ("rank 1", "for rank 3", "barrier 1", "CTA 5", "0.5 s", "unusable", "every rank"):
            assert part in text
    assert not any(launch.calls for launch in launches.values())
    with pytest.raises(CommTimeoutError):
        comm.check()


def test_check_synchronises_the_given_stream() -> None:
    comm, _, _, resources = make()
    comm.check()
    comm.check(stream=5)
    assert resources.synced == [None, 5]


def test_closed_communicator() -> None:
    comm, _, words, resources = make()
    comm.close()
    comm.close()  # idempotent
    assert resources.closed == 1
    assert comm.closed
    with pytest.raises(CommClosedError, match=r"rank 1 is closed.*every rank"):
        comm.all_reduce_raw(0x1000, 0x9000, 8, "bf16")
    with pytest.raises(CommClosedError):
        comm.check()
    words[0] = ERROR_TIMEOUT  # the freed record is no longer read
    with pytest.raises(CommClosedError):
        comm.all_reduce_raw(0x1000, 0x9000, 8, "bf16")


def test_context_manager_closes() -> None:
    comm, _, _, resources = make()
    with comm as same:
        assert same is comm
    assert resources.closed == 1


# --- settings, policy, variant choice ----------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"world": 1}, r"world must be an int in \[2, 16\]"),
        ({"world": 17}, r"world must be an int in \[2, 16\]"),
        ({"world": True}, "world must be"),
        ({"rank": 4}, r"rank must be an int in \[0, world=4\)"),
        ({"rank": -1}, "rank must be"),
        ({"capacity_bytes": 0}, "capacity_bytes must be"),
        ({"capacity_bytes": 1 << 33}, "capacity_bytes must be"),
        ({"dtypes": ("bf16", "fp32")}, "dtypes must be distinct names"),
        ({"dtypes": ("bf16", "bf16")}, "dtypes must be distinct names"),
        ({"dtypes": ()}, "dtypes must be distinct names"),
        ({"timeout_s": 0}, "timeout_s must be"),
        ({"timeout_s": "10"}, "timeout_s must be"),
        ({"policy": {"blocks": 8}}, "policy must be a b12x_aot.comm.Policy"),
    ],
)
def test_settings_refuse_bad_arguments(kwargs: dict, problem: str) -> None:
    args = {
        "rank": 0,
        "world": 4,
        "capacity_bytes": 4096,
        "dtypes": ("bf16",),
        "timeout_s": 1.0,
        "policy": None,
    }
    with pytest.raises(CommArgumentError, match=problem) as err:
        Settings.of(**{**args, **kwargs})
    assert isinstance(err.value, ValueError)
    assert err.value.exit_code == 2


def test_settings_round_capacity_to_packs() -> None:
    s = Settings.of(rank=0, world=2, capacity_bytes=17, dtypes="fp16", timeout_s=1, policy=None)
    assert (s.slot_bytes, s.dtypes, s.timeout_s, s.policy) == (32, ("fp16",), 1.0, Policy())


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"cta_threads": 0}, "cta_threads must be a positive int"),
        ({"blocks": 2.5}, "blocks must be a positive int"),
        ({"transport": "mail"}, "transport must be one of"),
        ({"twoshot_from_bytes": -1}, "twoshot_from_bytes"),
    ],
)
def test_policy_refuses_bad_fields(kwargs: dict, problem: str) -> None:
    with pytest.raises(CommArgumentError, match=problem):
        Policy(**kwargs)


def built(world: int, dtype: str, shapes: list[tuple[int, int]], transports=("pull", "push")) -> list[dict]:
    return [
        {"dtype": dtype, "world": world, "algorithm": a, "transport": t, "cta_threads": c, "blocks": b}
        for a in ("oneshot", "twoshot")
        for t in transports
        for c, b in shapes
    ]


def test_choose_variants_prefers_the_policy_then_the_nearest() -> None:
    entries = built(4, "bf16", [(256, 8), (512, 16), (512, 32)]) + built(2, "bf16", [(256, 8)])
    chosen = choose_variants(entries, world=4, dtypes=("bf16",), policy=Policy())
    assert set(chosen) == {("bf16", a, t) for a in ("oneshot", "twoshot") for t in ("pull", "push")}
    assert {(v.cta_threads, v.blocks) for v in chosen.values()} == {(512, 16)}
    near = choose_variants(entries, world=4, dtypes=("bf16",), policy=Policy(cta_threads=384, blocks=24))
    assert {(v.cta_threads, v.blocks) for v in near.values()} == {
        (512, 16)
    }  # tie on threads: larger; blocks: smaller
    only_small = choose_variants(
        built(2, "bf16", [(256, 8), (256, 32)]), world=2, dtypes=("bf16",), policy=Policy()
    )
    assert {(v.cta_threads, v.blocks) for v in only_small.values()} == {(256, 8)}
    assert choose_variants(entries, world=8, dtypes=("bf16",), policy=Policy()) == {}
    assert choose_variants(entries, world=4, dtypes=("fp16",), policy=Policy()) == {}


def test_choose_variants_is_order_independent() -> None:
    entries = built(4, "fp16", [(256, 8), (512, 32), (256, 32)])
    a = choose_variants(entries, world=4, dtypes=("fp16",), policy=Policy())
    b = choose_variants(list(reversed(entries)), world=4, dtypes=("fp16",), policy=Policy())
    assert a == b and list(a) == list(b)


def test_required_keys_follow_what_the_policy_can_pick() -> None:
    policy = Policy(twoshot_from_bytes=1 << 20)
    assert required_keys(("bf16",), policy, 1 << 16) == [("bf16", "oneshot", "pull")]
    assert required_keys(("bf16",), policy, 1 << 20) == [
        ("bf16", "oneshot", "pull"),
        ("bf16", "twoshot", "pull"),
    ]
    assert required_keys(("fp16",), Policy(twoshot_from_bytes=16, transport="push"), 64) == [
        ("fp16", "twoshot", "push")
    ]


# --- agreement between ranks --------------------------------------------------------------------


def info(rank: int, **kw: Any) -> PeerInfo:
    base = dict(
        rank=rank, world=3, pid=100 + rank, hostname="h", device=rank, device_uuid=f"gpu{rank}",
        window_bytes=2 << 20, window_va=VA, fd_address="@x", slot_bytes=4096, dtypes=("bf16",),
        variants=(("bf16", "oneshot", "pull", 512, 16),), policy=(512, 16, "pull", 524288),
    )  # fmt: skip
    return PeerInfo(**{**base, **kw})


def test_peer_info_round_trips() -> None:
    me = info(0)
    assert PeerInfo.decode(me.encode(), 1, 0) == me
    with pytest.raises(RendezvousError, match="rank 2 sent an unreadable descriptor"):
        PeerInfo.decode(b"{not json", 1, 2)


@pytest.mark.parametrize(
    ("field", "theirs", "what"),
    [
        ("slot_bytes", 8192, "capacity"),
        ("dtypes", ("bf16", "fp16"), "dtypes"),
        ("world", 4, "world"),
        ("variants", (("bf16", "oneshot", "pull", 256, 8),), "variants"),
        ("policy", (512, 16, "push", 524288), "policy"),
        ("hostname", "other", "host"),
    ],
)
def test_peers_that_disagree_are_named_with_both_values(field: str, theirs: Any, what: str) -> None:
    infos = [info(0), info(1), info(2, **{field: theirs})]
    with pytest.raises(PeerMismatchError, match=what) as err:
        check_peers(infos[0], infos)
    e = err.value
    assert (e.rank, e.peer, e.theirs) == (0, 2, theirs)
    assert e.ours == getattr(infos[0], field)
    assert f"rank 2 has {theirs!r}" in str(e)


def test_a_failed_peer_is_reported() -> None:
    infos = [info(0), info(1, error="VariantMissError: no such variant"), info(2)]
    with pytest.raises(PeerSetupError, match="because rank 1 failed: VariantMissError"):
        check_peers(infos[0], infos)


def test_device_sharing_rules() -> None:
    virtual = [info(r, pid=7, device=0, device_uuid="gpu0") for r in range(3)]
    check_peers(virtual[1], virtual)
    assert ranks_sharing_device(virtual[1], virtual) == 3
    split = [info(0, pid=7), info(1, pid=7), info(2)]
    with pytest.raises(CommError, match="share process 7 but use different GPUs"):
        check_peers(split[0], split)
    shared = [info(0), info(1, device_uuid="gpu0"), info(2)]
    with pytest.raises(CommError, match=r"different processes .* on the same GPU"):
        check_peers(shared[0], shared)
    separate = [info(r) for r in range(3)]
    check_peers(separate[2], separate)
    assert ranks_sharing_device(separate[2], separate) == 1


# --- the window header and the error record ---------------------------------------------------------


def test_header_image_and_peer_table_follow_the_layout() -> None:
    image = header_image(500_000_000, 0xABCD_EF00)
    assert len(image) == FLAGS_OFFSET
    assert struct.unpack_from("<Q", image, TIMEOUT_OFFSET)[0] == 500_000_000
    assert struct.unpack_from("<Q", image, ERROR_PTR_OFFSET)[0] == 0xABCD_EF00
    assert image[:8] == bytes(8)  # calls and arrive start at zero
    assert image[PEERS_OFFSET:FLAGS_OFFSET] == bytes(FLAGS_OFFSET - PEERS_OFFSET)
    table = peer_table([VA, VA + 1, VA + 2])
    assert struct.unpack(f"<{MAX_WORLD}Q", table) == (VA, VA + 1, VA + 2, *[0] * 13)
    full = peer_table([VA + r for r in range(MAX_WORLD)])  # a full table stops short of the flags
    assert len(full) == 8 * MAX_WORLD and PEERS_OFFSET + len(full) <= FLAGS_OFFSET
    with pytest.raises(CommArgumentError):
        peer_table([0] * (MAX_WORLD + 1))


def test_decode_error() -> None:
    assert decode_error(0, 99) is None
    assert decode_error(ERROR_TIMEOUT | 1 << 24 | 7 << 16 | 63, 5) == (1, 7, 63, 5)
    assert decode_error(ERROR_TIMEOUT | 0 << 24 | 15 << 16 | 2, 9) == (0, 15, 2, 9)  # rank 15 of 16


def test_errors_share_the_project_base_not_the_loaders() -> None:
    assert issubclass(CommError, B12xError) and not issubclass(CommError, LoaderError)
    assert issubclass(CapacityError, ValueError) and issubclass(CapacityError, CommError)
    assert not issubclass(CommTimeoutError, ValueError)


# --- environment, launcher, import budget -------------------------------------------------------------


def test_launch_env_is_read_and_missing_variables_are_named() -> None:
    env = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "B12X_COMM_RENDEZVOUS": "/tmp/x.sock"}
    got = read_launch_env(env)
    assert (got.rank, got.world, got.device, got.rendezvous) == (1, 2, 1, "/tmp/x.sock")
    assert read_launch_env({**env, "B12X_COMM_DEVICE": "5"}).device == 5
    with pytest.raises(CommArgumentError, match=r"RANK is not set.*b12x_aot.comm.launch"):
        read_launch_env({k: v for k, v in env.items() if k != "RANK"})
    with pytest.raises(CommArgumentError, match="WORLD_SIZE must be an integer"):
        read_launch_env({**env, "WORLD_SIZE": "two"})
    with pytest.raises(CommArgumentError, match="B12X_COMM_RENDEZVOUS is not set"):
        read_launch_env({k: v for k, v in env.items() if k != "B12X_COMM_RENDEZVOUS"})


SCRIPT = """
    import json, os, sys, time
    from pathlib import Path
    from b12x_aot.comm import UnixSocketRendezvous
    from b12x_aot.comm._settings import read_launch_env

    env = read_launch_env()
    keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "B12X_COMM_DEVICE", "CUDA_VISIBLE_DEVICES",
            "NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS")
    with UnixSocketRendezvous(env.rendezvous, env.rank, env.world, timeout=30) as rdv:
        everyone = [x.decode() for x in rdv(str(env.rank).encode())]
    seen = {k: os.environ.get(k) for k in keys} | {"everyone": everyone}
    Path(sys.argv[1], f"rank{env.rank}.json").write_text(json.dumps(seen))
    if env.rank == int(sys.argv[2]):
        sys.exit(int(sys.argv[3]))
    if sys.argv[2] != "-1":
        time.sleep(120)  # the launcher must stop this one when the failing rank exits
"""


def launch(tmp_path: Path, *args: str, fail_rank: int = -1, code: int = 0, timeout: float = 60):
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(SCRIPT))
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "3", "NCCL_NVLS_ENABLE": "1"}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "b12x_aot.comm.launch",
            *args,
            str(script),
            str(tmp_path),
            str(fail_rank),
            str(code),
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def test_launcher_sets_the_environment_and_exits_zero(tmp_path: Path) -> None:
    proc = launch(tmp_path, "--nproc", "3", "--devices", "2,0,1")
    assert proc.returncode == 0, proc.stderr
    import json

    for rank in range(3):
        seen = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert seen["RANK"] == str(rank) and seen["WORLD_SIZE"] == "3" and seen["LOCAL_RANK"] == str(rank)
        assert seen["B12X_COMM_DEVICE"] == "201"[rank]
        assert seen["CUDA_VISIBLE_DEVICES"] is None
        for name, value in NO_MULTICAST_ENV.items():
            assert seen[name] == value
        assert seen["everyone"] == ["0", "1", "2"]


def test_launcher_forwards_a_failure_and_stops_the_others(tmp_path: Path) -> None:
    proc = launch(tmp_path, "--nproc", "3", fail_rank=1, code=3, timeout=60)
    assert proc.returncode == 3
    assert "rank 1 exited with 3" in proc.stderr


def test_launcher_refuses_a_device_list_of_the_wrong_length(tmp_path: Path) -> None:
    proc = launch(tmp_path, "--nproc", "2", "--devices", "0,1,2")
    assert proc.returncode == 2
    assert "one device per process" in proc.stderr


def test_creation_refuses_bad_arguments_before_any_driver_work() -> None:
    from b12x_aot.comm import ThreadRendezvous, create_local_group

    with pytest.raises(CommArgumentError, match=r"world must be an int in \[2, 16\]"):
        create_local_group(None, world=1, capacity_bytes=4096)  # type: ignore[arg-type]
    with pytest.raises(CommArgumentError, match="capacity_bytes must be"):
        Communicator.create(
            None,  # type: ignore[arg-type]
            rank=0,
            world=2,
            capacity_bytes=-1,
            rendezvous=ThreadRendezvous(2).member(0),
        )


def test_from_env_refuses_a_missing_launcher_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(CommArgumentError, match="RANK is not set"):
        Communicator.from_env(None, 4096)  # type: ignore[arg-type]


def test_raw_stream_takes_handles_and_torch_streams_and_refuses_the_rest() -> None:
    from b12x_aot.comm._device import raw_stream

    class TorchLikeStream:
        cuda_stream = 0x51

    assert raw_stream(None) is None and raw_stream(7) == 7
    assert raw_stream(TorchLikeStream()) == 0x51
    with pytest.raises(
        CommArgumentError, match=r"stream is not a CUDA stream \(got object\)\. Pass a torch\.cuda"
    ):
        raw_stream(object())


def test_a_bad_stream_fails_every_rank_without_waiting_for_the_rendezvous_timeout() -> None:
    """The stream is checked inside setup, so the peers hear of the failure at once."""
    import threading

    from b12x_aot.comm import ThreadRendezvous

    rendezvous = ThreadRendezvous(2, timeout=20.0)
    raised: dict[int, BaseException] = {}

    def rank(r: int, stream: Any) -> None:
        try:
            Communicator.create(
                None,  # type: ignore[arg-type]  # setup fails before the registry is read
                rank=r,
                world=2,
                capacity_bytes=4096,
                rendezvous=rendezvous.member(r),
                device=0,
                stream=stream,
            )
        except BaseException as exc:
            raised[r] = exc

    threads = [threading.Thread(target=rank, args=(r, s)) for r, s in ((0, object()), (1, None))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert isinstance(raised[0], CommArgumentError) and "stream is not a CUDA stream" in str(raised[0])
    # Rank 1 fails on its own (no GPU, or no registry) or hears of rank 0: never a rendezvous timeout.
    assert 1 in raised and not isinstance(raised[1], RendezvousError), raised.get(1)
