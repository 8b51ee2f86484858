"""Misuse of the channels gets a typed error before anything is written, and leaves the
channel usable: load_into / read(out=) into arrays that do not fit the board, tensors the board
cannot carry, pushes of arrays that are not the ring's records, copies that fail half way,
reservations given back, counts of zero or below."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tests.channels_util import unique, watchdog
from transport.channels import (
    ChannelClosedError,
    ChannelError,
    ChannelMismatchError,
    PolicyBoard,
    Ring,
)
from transport.generated import experience

# -- policy board ------------------------------------------------------------------------------


def _mlp(torch: Any, last: int = 2, *, bias: bool = True) -> Any:
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, last, bias=bias))


def _with_int_last_weight(module: Any) -> Any:
    import torch

    weight = torch.zeros(module[1].weight.shape, dtype=torch.int32)
    module[1].weight = torch.nn.Parameter(weight, requires_grad=False)
    return module


def test_load_into_checks_every_tensor_before_writing_any() -> None:
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    source = _mlp(torch)
    with watchdog(30), PolicyBoard.create(unique("li"), source.state_dict()) as board:
        board.publish(source.state_dict())
        reader = PolicyBoard.open(board.name)  # no template: nothing checked at open
        try:
            for actor in (
                _mlp(torch, last=5),  # the last layer's shape differs
                _mlp(torch, bias=False),  # the module lacks a tensor of the board
                torch.nn.Sequential(*_mlp(torch), torch.nn.Linear(2, 2)),  # has one more
                _with_int_last_weight(_mlp(torch)),  # float32 does not cast to int32
            ):
                before = actor[0].weight.detach().clone()
                with pytest.raises(ChannelMismatchError):
                    reader.load_into(actor)
                assert torch.equal(actor[0].weight, before)  # nothing was written
            larger = torch.nn.Sequential(*_mlp(torch), torch.nn.Linear(2, 2))
            assert reader.load_into(larger, strict=False) == 1  # its own extra layer stays
            assert torch.equal(larger[1].weight, source[1].weight)
        finally:
            reader.close()


def test_read_out_is_checked_before_copying() -> None:
    with watchdog(30), PolicyBoard.create(unique("ro"), {"a": np.zeros(4), "b": np.zeros(3)}) as b:
        b.publish({"a": np.arange(4.0), "b": np.arange(3.0)})
        readonly = np.zeros(3)
        readonly.setflags(write=False)
        bad_outs: list[dict[str, Any]] = [
            {"a": np.full(4, -1.0), "b": np.zeros(5)},  # the last array's shape differs
            {"a": np.full(4, -1.0)},  # an array missing
            {"a": np.full(4, -1.0), "b": np.zeros(3, dtype=np.int64)},  # f8 -> i8 is unsafe
            {"a": np.full(4, -1.0), "b": readonly},
            {"a": np.full(4, -1.0), "b": [0.0, 0.0, 0.0]},  # not a NumPy array
        ]
        for out in bad_outs:
            with pytest.raises(ChannelMismatchError):
                b.read(out)
            assert (out["a"] == -1.0).all()  # nothing was copied
        out = {"a": np.empty(4), "b": np.empty(3, dtype=np.float32)}  # f8 -> f4: same_kind
        version, got = b.read(out)
        assert version == 1 and got is out and (out["b"] == [0, 1, 2]).all()


def test_load_into_a_non_contiguous_cpu_parameter() -> None:
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    source = torch.nn.Linear(4, 3)
    with watchdog(30), PolicyBoard.create(unique("nc"), source.state_dict()) as board:
        board.publish(source.state_dict())
        actor = torch.nn.Linear(4, 3)
        actor.weight = torch.nn.Parameter(torch.zeros(4, 3).T)  # CPU, transposed storage
        assert not actor.weight.is_contiguous()
        with PolicyBoard.open(board.name, source.state_dict()) as reader:
            assert reader.load_into(actor) == 1
        assert torch.equal(actor.weight, source.weight)
        assert torch.equal(actor.bias, source.bias)
        x = torch.randn(2, 4)
        assert torch.allclose(actor(x), source(x))  # (another matmul layout: not bitwise)


def test_load_into_a_tensor_off_the_cpu_says_where_it_is() -> None:
    torch = pytest.importorskip("torch")
    source = torch.nn.Linear(4, 3)
    with watchdog(30), PolicyBoard.create(unique("dev"), source.state_dict()) as board:
        board.publish(source.state_dict())
        with pytest.raises(ChannelMismatchError, match="meta"):
            board.load_into(torch.nn.Linear(4, 3, device="meta"))


def test_bfloat16_is_a_typed_error_at_create_open_publish_and_load_into() -> None:
    torch = pytest.importorskip("torch")
    model = torch.nn.Linear(4, 3)
    bf16 = model.to(torch.bfloat16).state_dict()
    name = unique("bf")
    with watchdog(30):
        with pytest.raises(ChannelMismatchError, match="bfloat16"):
            PolicyBoard.create(name, bf16)
        as_float = {k: v.float() for k, v in bf16.items()}
        with PolicyBoard.create(name, as_float) as board:
            with pytest.raises(ChannelMismatchError, match="bfloat16"):
                PolicyBoard.open(name, bf16, timeout=1)
            with pytest.raises(ChannelMismatchError, match="bfloat16"):
                board.publish(bf16)
            board.publish(as_float)
            with pytest.raises(ChannelMismatchError, match="bfloat16"):
                board.load_into(model)  # the module is bfloat16
        raw = {k: v.view(torch.int16) for k, v in bf16.items()}  # the documented way: its bits
        with PolicyBoard.create(name, raw) as board:
            board.publish(raw)
            _, arrays = board.read()
            for k, v in bf16.items():
                assert torch.equal(torch.from_numpy(arrays[k]).view(torch.bfloat16), v)


# -- experience ring ---------------------------------------------------------------------------


class _Exploding(np.ndarray):
    """Records whose slices fail: a copy that raises after the producer reserved room."""

    def __getitem__(self, key: Any) -> Any:
        raise RuntimeError("boom")


def test_push_refuses_arrays_that_are_not_the_rings_records_before_reserving() -> None:
    with watchdog(30), Ring.create(unique("pd"), experience.Transition, 8) as ring:
        producer, consumer = ring.producer(), ring.consumer()
        for bad in (
            np.full(2, 7.0),  # not records at all
            np.zeros(1, dtype=experience.Probe64.dtype),  # another struct
            np.zeros((2, 2), dtype=ring.records.dtype),  # records, but 2-D
            ring.records[0],  # one np.void record, not an array of them
            [0, 1],
        ):
            with pytest.raises(ChannelMismatchError):
                producer.push(bad)  # type: ignore[arg-type]
            assert ring.head == 0  # nothing reserved
        good = np.zeros(2, dtype=experience.Transition.dtype)
        good["action"] = [3, 4]
        assert producer.push(good, timeout=1) == 0
        with consumer.take(8, timeout=1) as batch:
            assert list(batch.field("action")) == [3, 4]


def test_a_push_whose_copy_fails_gives_its_reservation_back() -> None:
    with watchdog(30), Ring.create(unique("pw"), experience.Transition, 8) as ring:
        producer, consumer = ring.producer(), ring.consumer()
        records = np.zeros(3, dtype=ring.records.dtype)
        with pytest.raises(RuntimeError, match="boom"):
            producer.push(records.view(_Exploding), timeout=1)
        assert ring.head == 0 and ring.lost == 0  # undone: nothing reserved, nothing lost
        records["action"] = [1, 2, 3]
        assert producer.push(records, timeout=1) == 0  # the producer is not wedged
        with consumer.take(8, timeout=1) as batch:  # nor is the consumer
            assert list(batch.field("action")) == [1, 2, 3] and batch.first == 0


def test_abort_skips_a_reservation_another_producer_reserved_after() -> None:
    with (
        watchdog(30),
        Ring.create(unique("ab"), experience.Transition, 8, multi_producer=True) as ring,
    ):
        a, b, consumer = ring.producer(), ring.producer(), ring.consumer()
        a.abort()  # nothing reserved: nothing to do
        a.reserve_many(2)
        b.reserve()["action"] = 9
        b.commit()
        a.abort(timeout=1)  # records 0, 1 cannot be un-reserved: skipped, counted as lost
        with consumer.take(8, timeout=1) as batch:
            assert batch.first == 2 and list(batch.field("action")) == [9]
        assert ring.lost == 2
        a.reserve()["action"] = 5  # a goes on
        a.commit()
        with consumer.take(8, timeout=1) as batch:
            assert batch.first == 3 and list(batch.field("action")) == [5]
        a.reserve()
        a.abort()  # the last reservation: undone, not lost
        assert ring.head == 4 and ring.lost == 2


def test_closing_a_producer_with_an_open_reservation_does_not_stall_the_consumer() -> None:
    with watchdog(30), Ring.create(unique("cs"), experience.Transition, 8) as ring:
        producer, consumer = ring.producer(), ring.consumer()
        producer.push(np.zeros(1, dtype=ring.records.dtype))
        producer.reserve()  # e.g. filling it raised in a `with producer:` block
        producer.close()
        consumer.take(8, timeout=1).release()
        with pytest.raises(ChannelClosedError):  # the end of the stream, not a hang
            consumer.take(8, timeout=1)


def test_closing_a_producer_whose_reservation_others_reserved_after() -> None:
    with (
        watchdog(30),
        Ring.create(unique("cm"), experience.Transition, 8, multi_producer=True) as ring,
    ):
        early, leaver, late = ring.producer(), ring.producer(), ring.producer()
        consumer = ring.consumer()
        early.reserve()["action"] = 1  # record 0: still being written
        leaver.reserve()  # record 1
        late.reserve()["action"] = 3  # record 2
        late.commit()
        leaver.close()  # record 1 can be neither undone nor skipped yet: left as a dead one's
        early.commit()
        got: list[int] = []
        while len(got) < 2:
            with consumer.take(8, timeout=5) as batch:
                got += list(batch.field("action"))
        assert got == [1, 3] and ring.lost == 1


def test_counts_of_zero_and_below() -> None:
    with watchdog(30), Ring.create(unique("zc"), experience.Transition, 8) as ring:
        producer, consumer = ring.producer(), ring.consumer()
        producer.push(np.zeros(3, dtype=ring.records.dtype))
        with consumer.take(0, timeout=None) as batch:  # up to 0 records: none, at once
            assert len(batch) == 0 and batch.copy().shape == (0,)
        with pytest.raises(ValueError):
            consumer.take(-1, timeout=0)
        with consumer.take(2**40, timeout=1) as batch:  # more than a u32: all there are
            assert len(batch) == 3
        for n in (0, -3):
            with pytest.raises(ValueError):
                producer.reserve_many(n, timeout=0)
        assert ring.head == 3
        view = producer.reserve_many(2**40, timeout=1)  # as many as fit up to the wrap
        assert len(view) == 5
        producer.commit()
        with pytest.raises(ChannelError, match="nothing reserved"):
            producer.commit()
