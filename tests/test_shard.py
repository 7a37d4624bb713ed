"""The shard server and client in-process, without Spark."""

import contextlib
import json
import threading

import numpy as np
import pyarrow.flight as flight
import pytest

from pystrads.errors import ShardUnavailableError
from pystrads.ps.client import ShardClient, ShardGroup, ShardInfo
from pystrads.ps.partition import TableLayout, range_bounds
from pystrads.ps.server import ShardServer
from pystrads.ps.table import RowEntries

TOKEN = "test-token"


class _Program:
    """pull: new = current + sum of partials (first column)."""

    def pull(self, table, keys, partials, current):
        return current + partials[:, :1]


@pytest.fixture()
def shards():
    servers = [ShardServer("grpc://127.0.0.1:0", TOKEN, 1e9, f"s{i}") for i in range(2)]
    group = ShardGroup([ShardInfo("127.0.0.1", s.port, 0, "exec", f"s{i}") for i, s in enumerate(servers)],
                       TOKEN, chunk_bytes=4096)
    yield servers, group
    for s in servers:
        s.shutdown()


def group_layout(group, name="fit/t", rows=10, width=1):
    bounds = tuple(int(b) for b in range_bounds(rows, len(group.shards)))
    return TableLayout(name, rows, width, "float64", bounds, tuple(range(len(group.shards))), width)


def make_table(group, name="fit/t", rows=1000, width=3, dtype="float64", contrib_width=None, storage="dense",
               max_fill=0.5):
    bounds = tuple(int(b) for b in range_bounds(rows, len(group.shards)))
    layout = TableLayout(name, rows, width, dtype, bounds, tuple(range(len(group.shards))),
                         contrib_width or width)
    for shard, lo, hi in layout.ranges():
        group.client(shard).action("create_table", name=name, row_start=lo, row_stop=hi, width=width,
                                   dtype=dtype, contrib_width=layout.contrib_width, storage=storage,
                                   max_fill=max_fill)
    return group.table(layout)


@pytest.fixture(params=["dense", "sparse"])
def storage(request):
    """The table kinds: every read, write, step and round behaves the same on both."""
    return request.param


def test_refuses_calls_without_the_token(shards):
    servers, group = shards
    make_table(group, rows=10, width=1)
    uri = f"grpc://127.0.0.1:{servers[0].port}"
    for token in ("", "wrong", TOKEN + "x"):
        client = ShardClient(uri, token)
        with pytest.raises(ShardUnavailableError, match="token"):
            client.action("ping")
        with pytest.raises(ShardUnavailableError, match="token"):
            client.get_rows("fit/t", 1, "float64", start=0, stop=1)
        with pytest.raises(ShardUnavailableError, match="token"):
            client.write_rows("put", "fit/t", np.array([0]), np.ones((1, 1)), "float64")

    raw = flight.FlightClient(uri)  # every Flight method, without a token
    calls = [lambda: list(raw.do_action(flight.Action("ping", b""))),
             lambda: list(raw.do_action(flight.Action("shutdown", b'{"token": "x"}'))),
             lambda: list(raw.list_actions()),
             lambda: list(raw.list_flights()),
             lambda: raw.get_flight_info(flight.FlightDescriptor.for_command(b"x")),
             lambda: raw.get_schema(flight.FlightDescriptor.for_command(b"x")),
             lambda: list(raw.do_get(flight.Ticket(b'{"table": "fit/t", "start": 0, "stop": 1}'))),
             lambda: raw.do_exchange(flight.FlightDescriptor.for_command(b"x"))[1].read_all()]
    import pyarrow as pa

    for call in calls:  # (pyarrow reports get_schema's refusal as a generic ArrowException)
        with pytest.raises(pa.ArrowException, match="missing or wrong run token"):
            call()
    assert group.client(0).action("ping")["shard"] == "s0"
    assert group.table(group_layout(group)).read([3])[0, 0] == 0.0


def test_get_put_inc_round_trip_across_shards(shards, storage):
    _, group = shards
    table = make_table(group, storage=storage)
    values = np.arange(3000, dtype=np.float64).reshape(1000, 3)
    table.write(np.arange(1000), values)
    assert np.array_equal(table.read(), values)
    keys = np.array([999, 0, 500, 499, 3])
    assert np.array_equal(table.read(keys), values[keys])
    table.add([5, 5, 700], np.ones((3, 3)))  # duplicate keys add up
    got = table.read([5, 700])
    assert np.array_equal(got, values[[5, 700]] + np.array([[2.0], [1.0]]))
    with pytest.raises(IndexError, match="outside"):
        table.read([1000])
    with pytest.raises(ValueError, match="shape"):
        table.write([1, 2], np.ones((2, 4)))


@pytest.mark.parametrize("keys", [[3, 9, 40], [3, 3, 9, 40, 40], [40, 3, 9], [9, 3, 9, 40, 9], [7], []])
def test_shard_table_adds_every_key_each_time_it_is_given(keys):
    """A shard's write adds each key's row once per occurrence, whichever of its two paths the
    index takes (strictly increasing: fancy ``+=``; anything else: ``np.add.at``)."""
    from pystrads.ps.table import ShardTable

    table = ShardTable("t", 0, 50, 4, "int32", np.zeros((50, 4), np.int32), 4)
    rows = np.arange(4 * len(keys), dtype=np.int32).reshape(-1, 4) + 1
    table.add(np.asarray(keys, dtype=np.int64), rows)
    want = np.zeros((50, 4), np.int64)
    for k, r in zip(keys, rows):
        want[k] += r
    assert np.array_equal(table.values, want)
    table.add(slice(10, 12), np.ones((2, 4), np.int32))
    want[10:12] += 1
    assert np.array_equal(table.values, want)


def test_chunked_transfers_are_exact(shards, storage):
    _, group = shards  # chunk_bytes=4096 -> many batches per request
    table = make_table(group, rows=20000, width=5, storage=storage)
    values = np.random.default_rng(0).random((20000, 5))
    table.write(range(0, len(values)), values)
    assert np.array_equal(table.read(range(0, 20000)), values)
    keys = np.random.default_rng(1).permutation(20000)[:7000]
    assert np.array_equal(table.read(keys), values[keys])


def test_nonzero_reads_send_only_the_nonzero_rows_across_shards_and_chunks(shards, storage):
    servers, group = shards  # chunk_bytes=4096 -> many batches per shard's reply
    table = make_table(group, rows=20000, width=2, storage=storage)
    rng = np.random.default_rng(3)
    keys = np.unique(rng.integers(0, 20000, 3000))
    values = rng.random((len(keys), 2))
    values[::7, 0] = 0.0  # a row with one zero value still counts as non-zero
    table.write(keys, values)
    before = sum(s.state.counters()["rows_out"] for s in servers)
    got = table.read_entries(range(0, 20000))
    assert np.array_equal(got.keys, keys) and np.array_equal(got.toarray(), values)
    assert sum(s.state.counters()["rows_out"] for s in servers) - before == len(keys)  # not 20000 rows
    sub = (keys >= 5000) & (keys < 15000)  # a range across the two shards' bounds
    got = table.read_entries(range(5000, 15000))
    assert np.array_equal(got.keys, keys[sub]) and np.array_equal(got.toarray(), values[sub])
    assert got.toarray().dtype == values.dtype
    assert table.read_entries(range(0, 0)).shape == (0, 2) and len(table.read_entries(range(0, 0)).keys) == 0
    with pytest.raises(IndexError, match=r"range \[0, 20001\)"):
        table.read_entries(range(0, 20001))
    from pystrads.ps import protocol

    dense_nonzero = protocol.encode_header({"table": table.name, "token": group.token, "start": 0, "stop": 10,
                                            "nonzero": True})
    with pytest.raises(flight.FlightError, match="a nonzero read sends the rows' entries"):
        group.client(0)._client.do_get(flight.Ticket(dense_nonzero)).read_all()


def test_uncopied_reads_are_read_only_views_of_one_message(shards, storage):
    _, group = shards  # chunk_bytes=4096: a copied read of shard 0's rows takes many batches
    table = make_table(group, rows=20000, width=5, storage=storage)
    values = np.random.default_rng(0).random((20000, 5))
    table.write(range(0, len(values)), values)
    requests = group.client(0).action("stats")["requests"]
    view = table.read(range(100, 9000), copy=False)  # on shard 0 (rows [0, 10000))
    assert np.array_equal(view, values[100:9000]) and not view.flags.writeable
    assert not view.flags.owndata  # backed by the received Arrow buffer
    assert group.client(0).action("stats")["requests"] == requests + 2  # the get and this stats call
    both = table.read(copy=False)  # spans both shards: assembled into a new array
    assert np.array_equal(both, values) and both.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        view[0, 0] = 1.0


def test_integer_tables_and_stats(shards, storage):
    _, group = shards
    table = make_table(group, rows=10, width=2, dtype="int32", storage=storage)
    table.add(np.arange(10), np.ones((10, 2), dtype=np.int32))
    assert table.read().dtype == np.int32
    assert table.read().sum() == 20
    stats = group.client(0).action("stats")
    assert stats["requests"] >= 2 and stats["bytes_in"] > 0 and stats["rss_bytes"] > 0
    assert stats["tables"]["fit/t"]["rows"] == 5


def _enter(group, step, worker, task):
    fence = {"step": step, "worker": worker, "task": task}
    for i in range(len(group.shards)):
        group.client(i).action("enter", **fence)
    return fence


def test_retried_step_rolls_back_and_fences_out_zombies(shards, storage):
    _, group = shards
    table = make_table(group, rows=100, width=1, dtype="int64", storage=storage)
    table.write(np.arange(100), np.arange(100).reshape(-1, 1))
    group.broadcast("begin_step", step=1, num_workers=2, namespace="fit")
    f0 = _enter(group, 1, 0, task=10)
    _enter(group, 1, 1, task=11)
    old0 = table.fenced(**f0)
    old0.add(np.arange(0, 100, 7), np.ones((15, 1), dtype=np.int64))
    old0.write([99], [[-5]])
    # the stage is retried: worker 0 enters again with a newer task id
    f0b = _enter(group, 1, 0, task=12)
    _enter(group, 1, 1, task=13)
    assert np.array_equal(table.read()[:, 0], np.arange(100)), "rollback must restore every row"
    with pytest.raises(ShardUnavailableError, match="zombie|failed attempt"):
        old0.add([1], [[1]])
    table.fenced(**f0b).add([1], [[1]])
    group.broadcast("commit_step", step=1)
    expected = np.arange(100)
    expected[1] += 1
    assert np.array_equal(table.read()[:, 0], expected)


def test_abort_step_restores_rows(shards, storage):
    _, group = shards
    table = make_table(group, rows=50, width=2, storage=storage)
    base = np.random.default_rng(3).random((50, 2))
    table.write(range(0, len(base)), base)
    group.broadcast("begin_step", step=4, num_workers=1, namespace="fit")
    fence = _enter(group, 4, 0, task=1)
    table.fenced(**fence).add(np.arange(50), np.ones((50, 2)))
    assert not np.array_equal(table.read(), base)
    restored = sum(a["restored_rows"] for a in group.broadcast("abort_step", step=4))
    assert restored == 50
    assert np.array_equal(table.read(), base)
    with pytest.raises(ShardUnavailableError, match="open step"):
        table.fenced(**fence).add([0], [[1, 1]])


def test_abort_restores_rows_written_twice_with_repeated_unsorted_keys(shards, storage):
    """The undo log saves each row once, at its first write of the step, whatever the order
    and repeats of the keys (it dedups them by a sort: :mod:`pystrads.kernels.sets`)."""
    from pystrads.kernels.sets import union, unique

    rng = np.random.default_rng(8)
    for a in (np.zeros(0, np.int64), np.array([4]), rng.integers(0, 50, 1000), rng.integers(-9, 9, 77).astype(np.int32)):
        np.testing.assert_array_equal(unique(a), np.unique(a))
        assert unique(a).dtype == a.dtype
    np.testing.assert_array_equal(union([5, 1, 5], [3, 1]), [1, 3, 5])
    _, group = shards
    table = make_table(group, rows=50, width=2, storage=storage)
    base = rng.random((50, 2))
    table.write(range(0, len(base)), base)
    group.broadcast("begin_step", step=5, num_workers=1, namespace="fit")
    fence = _enter(group, 5, 0, task=1)
    keys = np.array([7, 3, 7, 41, 3, 3, 0, 49])
    table.fenced(**fence).add(keys, np.ones((len(keys), 2)))
    table.fenced(**fence).add(keys[::-1], np.ones((len(keys), 2)))
    after = base.copy()
    np.add.at(after, keys, 2.0)
    np.testing.assert_allclose(table.read(), after)
    restored = sum(a["restored_rows"] for a in group.broadcast("abort_step", step=5))
    assert restored == 5  # rows 0, 3, 7, 41, 49: each saved once
    assert np.array_equal(table.read(), base)


@pytest.mark.parametrize("dtype", ["int32", "float64"])
def test_sparse_reads_and_writes_carry_the_same_rows_in_fewer_bytes(shards, dtype, storage):
    """Rows read and written as :class:`RowEntries` send each row's non-zero entries only (a
    mostly-zero block: about a tenth of the bytes) and give the very same rows as dense ones,
    across shards and batches; a step's entry writes roll back exactly."""
    servers, group = shards
    table = make_table(group, rows=300, width=40, dtype=dtype, storage=storage)
    rng = np.random.default_rng(3)
    base = (rng.random((300, 40)) < 0.08) * rng.integers(1, 9, (300, 40))
    table.write(np.arange(300), RowEntries.from_rows(np.full((300, 40), 7)))
    table.write(range(0, 300), RowEntries.from_rows(base))  # a put replaces whole rows
    assert np.array_equal(table.read(), base)
    keys = np.sort(rng.permutation(300)[:120])
    before = sum(s.state.counters()["bytes_out"] for s in servers)
    got = table.read_entries(keys)
    sparse_bytes = sum(s.state.counters()["bytes_out"] for s in servers) - before
    assert np.array_equal(got.keys, keys) and got.shape == (120, 40)
    assert got.vals.dtype == table.read(keys).dtype and np.array_equal(got.toarray(), base[keys])
    assert sparse_bytes < 0.3 * base[keys].astype(got.vals.dtype).nbytes, sparse_bytes
    assert np.array_equal(table.read_entries(np.arange(100, 180)).toarray(), base[100:180])  # a run
    with pytest.raises(ValueError, match="strictly increasing"):
        table.read_entries(keys[::-1])
    delta = (rng.random((120, 40)) < 0.05) * rng.integers(-3, 4, (120, 40))
    delta[:5] = 0  # rows without a non-zero entry
    group.broadcast("begin_step", step=9, num_workers=1, namespace="fit")
    fence = _enter(group, 9, 0, task=1)
    table.fenced(**fence).add(keys, RowEntries.from_rows(delta))
    want = base.copy()
    want[keys] += delta
    assert np.array_equal(table.read(), want)
    group.broadcast("abort_step", step=9)
    assert np.array_equal(table.read(), base)
    with pytest.raises(ValueError, match="121 offsets"):  # entries of another number of rows
        table.add(keys, RowEntries.from_rows(np.ones((120, 40))[:-1]))
    with pytest.raises(ValueError, match="width 39"):
        table.add(keys, RowEntries.from_rows(np.ones((120, 39))))
    with pytest.raises(ValueError, match="carry keys other than where"):
        table.add(keys, RowEntries.from_rows(delta, keys=keys[::-1]))
    assert np.array_equal(table.read(), base)  # refused before anything was sent
    with pytest.raises(Exception, match="sparse"):
        group.client(0).write_entries("contribute", table.layout.name, np.arange(2), np.array([0, 1, 2]),
                                      np.array([0, 1], np.int32), np.ones(2), dtype, {"round": 0})


def test_sparse_entries_refuse_column_indexes_outside_the_row():
    from pystrads.ps import protocol

    cols, vals = protocol.rows_to_sparse(np.eye(3, 4))
    offsets, c, v = protocol.sparse_entries(cols, vals, "float64", 4)
    assert offsets.tolist() == [0, 1, 2, 3] and c.tolist() == [0, 1, 2] and v.tolist() == [1.0, 1.0, 1.0]
    with pytest.raises(ValueError, match=r"outside \[0, 2\)"):
        protocol.sparse_entries(cols, vals, "float64", 2)


@pytest.mark.parametrize("streamed", [False, True])
def test_a_round_exchange_carries_contributions_and_brings_back_the_pulled_rows(shards, storage, streamed):
    """The worker's tick (``contribute(..., read_back=True)``): one exchange per shard
    carries the contribution and the tick and brings back the rows after the round's pull;
    over two shards, with unsorted repeated keys and a second table contributed by range, the
    rows equal a ``get`` after the round, in the keys' order, and the table holds every sum.
    ``streamed``: the rounds travel on rounds streams (three workers of one process share each
    shard's client, so some rounds open streams of their own), which end when turned off."""
    import base64
    import pickle

    from pyspark import cloudpickle

    from pystrads.engine.program import WorkerContext
    from pystrads.engine.executor.worker import WorkerSpec, _Worker

    _, group = shards
    table = make_table(group, rows=30, width=1, contrib_width=2, storage=storage)
    other = make_table(group, name="fit/g", rows=6, width=1, contrib_width=1, storage=storage)
    for i in range(2):
        group.client(i).action("register_program", namespace="fit",
                               payload=base64.b64encode(cloudpickle.dumps(_Program())).decode())
    group.broadcast("begin_step", step=1, num_workers=3, namespace="fit")
    fences = [_enter(group, 1, w, task=100 + w) for w in range(3)]
    spec = WorkerSpec(program=pickle.dumps(None), program_hash="", group=group,
                      layouts={"t": table.layout, "g": other.layout}, num_workers=3, seed=0, timeout=30,
                      namespace="fit", fingerprint=False)
    keys_of = lambda w, rnd: np.random.default_rng([w, rnd]).integers(0, 30, 12)  # noqa: E731
    seen, errors = {}, []

    def worker(w):
        try:
            runner = _Worker(spec, w, 100 + w, 0)
            handles = {name: group.table(layout).fenced(**fences[w]) for name, layout in spec.layouts.items()}
            ctx = WorkerContext(w, 3, 1, 0, handles, 0, 0)
            for rnd in range(4):
                ctx._begin_round(rnd)
                keys = keys_of(w, rnd)
                ctx.contribute("t", keys, np.column_stack([np.ones(len(keys)), np.zeros(len(keys))]),
                               read_back=True)
                ctx.contribute("g", range(0, 6), np.ones((6, 1)))
                runner.tick(fences[w], rnd, rnd, None, ctx=ctx)
                seen[(w, rnd)] = ("t" in ctx._pulled, ctx.pulled("t").copy(), table.read(keys))
        except Exception as exc:  # noqa: BLE001 -- reported below
            errors.append(exc)

    group.stream_rounds(streamed)
    threads = [threading.Thread(target=worker, args=(w,)) for w in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    group.stream_rounds(False)
    assert not errors, errors
    stats = group.broadcast("stats")
    assert all((s["round_streams"] > 0) == streamed and s["open_round_streams"] == 0 for s in stats), stats
    group.broadcast("commit_step", step=1)
    assert len(seen) == 12
    for (w, rnd), (fused, back, got) in seen.items():
        assert fused, (w, rnd)
        assert np.array_equal(back, got), (w, rnd)
    want = np.zeros(30)
    for w in range(3):
        for rnd in range(4):
            np.add.at(want, keys_of(w, rnd), 1.0)
    assert np.array_equal(table.read()[:, 0], want)
    assert np.array_equal(other.read()[:, 0], np.full(6, 12.0))


def _lone_worker(group, table):
    """Step 1 of fit ``fit`` open for one worker over ``table`` (its ``pull``: :class:`_Program`):
    the worker's fence and its runner (task 100), whose ``tick`` sends a context's round."""
    import base64
    import pickle

    from pyspark import cloudpickle

    from pystrads.engine.executor.worker import WorkerSpec, _Worker

    group.broadcast("register_program", namespace="fit", payload=base64.b64encode(cloudpickle.dumps(_Program())).decode())
    group.broadcast("begin_step", step=1, num_workers=1, namespace="fit")
    fence = _enter(group, 1, 0, task=100)
    spec = WorkerSpec(program=pickle.dumps(None), program_hash="", group=group, layouts={"t": table.layout},
                      num_workers=1, seed=0, timeout=30, namespace="fit", fingerprint=False)
    return fence, _Worker(spec, 0, 100, 0)


def test_a_rounds_stream_reads_back_in_chunks_and_outlives_a_refused_round(shards):
    """On a rounds stream, read-back rows larger than the chunk size come back whole (several
    messages); a round the shard refuses (a task that did not enter the step) raises the same
    error as a round of its own call would, and the next round goes through on a new stream."""
    from pystrads.engine.program import WorkerContext

    _, group = shards  # chunks of 4 096 bytes
    table = make_table(group, rows=2000, width=3, contrib_width=2)
    fence, runner = _lone_worker(group, table)
    keys = np.arange(1, 2000, 2)  # 1 000 keys: 12 000 bytes read back from each shard

    def round_(rnd, fence, read_back=True):
        ctx = WorkerContext(0, 1, 1, 0, {"t": table.fenced(**fence)}, 0, 0)
        ctx._begin_round(rnd)
        ctx.contribute("t", keys, np.column_stack([np.full(len(keys), rnd + 1.0), np.zeros(len(keys))]),
                       read_back=read_back)
        runner.tick(fence, rnd, rnd, None, ctx=ctx)
        return ctx.pulled("t")

    refused = {}
    for streamed in (False, True):
        group.stream_rounds(streamed)
        with pytest.raises(ShardUnavailableError, match="did not enter step 1") as err:
            round_(0, dict(fence, task=101))
        refused[streamed] = str(err.value).split(" on shard ")[0]
    assert refused[True] == refused[False]
    try:
        back = [round_(rnd, fence) for rnd in range(2)]
    finally:
        group.stream_rounds(False)
    stats = group.broadcast("stats")
    assert [s["round_streams"] for s in stats] == [2, 2] and [s["open_round_streams"] for s in stats] == [0, 0]
    assert np.array_equal(back[0][:, 0], np.ones(len(keys))) and np.array_equal(back[1][:, 0], np.full(len(keys), 3.0))
    assert np.array_equal(back[1], table.read(keys))
    group.broadcast("commit_step", step=1)


@pytest.mark.parametrize("streamed", [False, True])
def test_a_round_reads_back_the_columns_it_names(shards, streamed):
    """``contribute(..., read_back=[columns])``: the tick brings back only those columns of the
    pulled rows, in the order named, on a stream or not; column indexes outside the table are
    refused before anything is sent."""
    from pystrads.engine.program import WorkerContext

    _, group = shards
    table = make_table(group, rows=2000, width=3, contrib_width=1)
    table.write(range(0, 2000), np.arange(6000.0).reshape(2000, 3))
    fence, runner = _lone_worker(group, table)
    keys = np.array([1999, 5, 1000, 7, 3])  # both shards, any order
    ctx = WorkerContext(0, 1, 1, 0, {"t": table.fenced(**fence)}, 0, 0)
    with pytest.raises(ValueError, match=r"read_back columns \[3\] must be .* in \[0, 3\)"):
        ctx.contribute("t", keys, np.ones((len(keys), 1)), read_back=[3])
    assert ctx._take_outbox() == []
    group.stream_rounds(streamed)
    try:
        ctx.contribute("t", keys, np.ones((len(keys), 1)), read_back=[2, 0])
        runner.tick(fence, 0, 0, None, ctx=ctx)
    finally:
        group.stream_rounds(False)
    full = table.read(keys)
    assert np.array_equal(full[:, 0], keys * 3.0 + 1.0)  # the pull ran: column 0 gained the sums
    assert np.array_equal(ctx.pulled("t"), full[:, [2, 0]])
    group.broadcast("commit_step", step=1)


def test_round_clocks_bsp_and_contributions(shards, storage):
    _, group = shards
    table = make_table(group, rows=10, width=1, contrib_width=2, storage=storage)
    for i in range(2):
        group.client(i).action("register_program", namespace="fit",
                               payload=__import__("base64").b64encode(
                                   __import__("pyspark").cloudpickle.dumps(_Program())).decode())
    group.broadcast("begin_step", step=1, num_workers=3, namespace="fit")
    fences = [_enter(group, 1, w, task=100 + w) for w in range(3)]
    order, seen = [], {}

    def worker(w):
        handle = table.fenced(**fences[w])
        for rnd in range(4):
            handle.contribute(np.arange(10), np.full((10, 2), w + 1.0), rnd)
            for i in range(2):
                group.client(i).action("tick", **fences[w], round=rnd, wait_for=rnd, timeout=30,
                                       metrics={"n": 1.0} if i == 0 else None)
            seen[(w, rnd)] = table.read([0, 9])[:, 0].copy()
            order.append((w, rnd))

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    group.broadcast("commit_step", step=1)
    # after round r every worker sees (r + 1) * (1 + 2 + 3)
    for (w, rnd), values in seen.items():
        assert np.allclose(values, 6.0 * (rnd + 1)), (w, rnd, values)
    # BSP: no worker finished round r+1 before all finished round r
    done = {}
    for i, (w, rnd) in enumerate(order):
        done.setdefault(rnd, []).append(i)
    for rnd in range(3):
        assert max(done[rnd]) < min(done[rnd + 1]) + 3
    metrics = group.client(0).action("metrics")
    assert [metrics["rounds"][str(r)]["n"] for r in range(4)] == [3.0] * 4


class _Replace:
    """pull: the new rows are the summed partials."""

    def pull(self, table, keys, partials, current):
        return partials


@pytest.mark.parametrize("spread", [1, 25])  # a dense key range, and a sparse one
def test_a_rounds_contributions_sum_exactly_whatever_their_keys(shards, spread, storage):
    """The shard sums a round's parts before ``pull``: sorted parts, a part with repeated keys
    in any order, keys seen by one part only; rows nobody contributed to stay as they were."""
    servers, group = shards
    table = make_table(group, rows=1000, width=2, storage=storage)
    table.write(range(0, 1000), np.full((1000, 2), -1.0))
    group.client(0).action("register_program", namespace="fit", payload=__import__("base64").b64encode(
        __import__("pyspark").cloudpickle.dumps(_Replace())).decode())
    rng = np.random.default_rng(spread)
    parts = [(np.arange(0, 20 * spread, spread), rng.random((20, 2))),
             (np.arange(5 * spread, 19 * spread, spread), rng.random((14, 2))),
             (np.array([3, 3, 0, 3, 7]) * spread + 1, rng.random((5, 2))),
             (np.array([9, 2, 4]) * spread, rng.random((3, 2)))]
    servers[0].fences.apply_pull("fit/t", parts)
    want = np.full((1000, 2), np.nan)
    for keys, vals in parts:
        want[keys] = 0.0
    for keys, vals in parts:
        np.add.at(want, keys, vals)
    want[np.isnan(want)] = -1.0
    np.testing.assert_allclose(table.read(), want, rtol=1e-15)


def test_ssp_lets_a_worker_run_ahead_by_the_staleness_bound(shards):
    _, group = shards
    group.broadcast("begin_step", step=2, num_workers=2, namespace="fit")
    fast = _enter(group, 2, 0, task=1)
    slow = _enter(group, 2, 1, task=2)
    client = group.client(0)
    for i in range(2):
        group.client(i).action("tick", **slow, round=0, wait_for=-5)
    # staleness 2: the fast worker may finish rounds 0..2 while the slow one sits at round 0
    for rnd in range(3):
        for i in range(2):
            group.client(i).action("tick", **fast, round=rnd, wait_for=rnd - 2, timeout=5)
    from pystrads.errors import RoundTimeoutError

    with pytest.raises(RoundTimeoutError, match="round.timeoutSeconds"):
        client.action("tick", **fast, round=3, wait_for=1, timeout=1)
    group.broadcast("abort_step", step=2)


def test_concurrent_clients_add_up(shards):
    _, group = shards
    table = make_table(group, rows=64, width=1, dtype="int64")

    def hammer(seed):
        rng = np.random.default_rng(seed)
        for _ in range(50):
            keys = rng.integers(0, 64, 20)
            table.add(keys, np.ones((20, 1), dtype=np.int64))

    threads = [threading.Thread(target=hammer, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert table.read().sum() == 4 * 50 * 20


def test_malformed_requests_get_clear_errors(shards):
    servers, group = shards
    client = group.client(0)
    with pytest.raises(ValueError, match="unknown shard action 'no_such_action'"):
        client.action("no_such_action")  # refused before any call ...
    body = json.dumps({"token": TOKEN}).encode()
    with pytest.raises(flight.FlightServerError, match="unknown action 'no_such_action'; known: abort_step"):
        list(client._client.do_action(flight.Action("no_such_action", body)))  # ... and by the shard
    with pytest.raises(ShardUnavailableError, match="no table"):
        client.get_rows("fit/missing", 1, "float64", start=0, stop=1)
    make_table(group, rows=10, width=1)
    with pytest.raises(ShardUnavailableError, match="outside this shard"):
        client.get_rows("fit/t", 1, "float64", start=0, stop=10)  # shard 0 holds rows 0..4

    raw = flight.FlightClient(f"grpc://127.0.0.1:{servers[0].port}")
    bad = b'{"token": "%s", "table": 5}' % TOKEN.encode()
    with pytest.raises(flight.FlightError, match="field 'table' must be a string, got '5'"):
        list(raw.do_get(flight.Ticket(bad)))
    assert client.action("ping")["tables"] == 1  # still serving


def test_range_bounds_balance_weights():
    weights = np.r_[np.full(10, 100.0), np.ones(990)]
    bounds = range_bounds(1000, 2, weights)
    left = weights[:bounds[1]].sum()
    assert bounds[0] == 0 and bounds[-1] == 1000
    assert abs(left - weights.sum() / 2) <= weights.max()
    assert list(range_bounds(10, 3)) == [0, 3, 7, 10]
    assert list(range_bounds(0, 2)) == [0, 0, 0]


def test_fuzzed_requests_get_deliberate_errors_and_never_crash_or_hang(shards):
    """1,500 random tickets, put and exchange descriptors / batches and action bodies (most with the valid
    token, so they reach the handlers): every refusal is a deliberate Flight error (no Python
    traceback), no call hangs (5 s deadline), and the shard still serves correctly after."""
    import json
    import random

    import pyarrow as pa

    servers, group = shards
    make_table(group, name="fit/t", rows=200, width=3)
    client = flight.FlightClient(f"grpc://127.0.0.1:{servers[0].port}")
    options = flight.FlightCallOptions(timeout=5)
    rng = random.Random(7)
    nprng = np.random.default_rng(7)
    values = [None, -1, 0, 1, 99, 100, 101, 2 ** 63, -2 ** 70, 1e308, float("nan"), "x", "", [], {}, [1, 2],
              {"a": 1}, True, "fit/t", 3, 10 ** 12, "round", {"table": "fit/t"}, {"table": "fit/t", "start": 0}]
    fields = ["table", "start", "stop", "chunk", "op", "round", "name", "row_start", "row_stop", "width", "dtype",
              "prefix", "step", "num_workers", "namespace", "worker", "task", "wait_for", "timeout", "fill",
              "contrib_width", "payload", "metrics", "late", "late_round", "contribute", "read_back"]

    def request():
        head = {"token": TOKEN} if rng.random() < 0.85 else {}
        head.update({k: rng.choice(values) for k in rng.sample(fields, rng.randint(0, 6))})
        if rng.random() < 0.5:
            head["table"] = "fit/t"
        raw = json.dumps(head).encode()
        r = rng.random()
        return bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 48))) if r < 0.1 else \
            raw + b"\0" + bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 30))) if r < 0.2 else raw

    def batch():
        n, width = rng.randint(0, 5), rng.choice([1, 3, 4])
        value = pa.FixedSizeListArray.from_arrays(pa.array(nprng.random(n * width)), width)
        r = rng.random()
        if r < 0.3:
            return pa.record_batch([value], names=["value"])
        if r < 0.6:
            return pa.record_batch([pa.array(np.arange(n) * rng.choice([1, -1, 70])), value], names=["key", "value"])
        return pa.record_batch([pa.array([str(i) for i in range(n)]), pa.array(nprng.random(n))], names=["a", "b"])

    actions = ["ping", "heartbeat", "create_table", "begin_step", "enter", "tick", "commit_step", "abort_step",
               "metrics", "stats", "nope", ""]
    outcomes = {"ok": 0}
    for _ in range(1500):
        kind = rng.choice(["get", "put", "action", "exchange"])
        try:
            if kind == "get":
                list(client.do_get(flight.Ticket(request()), options))
            elif kind == "action":
                list(client.do_action(flight.Action(rng.choice(actions), request()), options))
            elif kind == "exchange":  # a worker's round (contribute, tick, read back)
                b = batch()
                writer, reader = client.do_exchange(flight.FlightDescriptor.for_command(request()), options)
                writer.begin(b.schema)
                writer.write_batch(b)
                writer.done_writing()
                reader.read_all()
                writer.close()
            else:
                b = batch()
                writer, _ = client.do_put(flight.FlightDescriptor.for_command(request()), b.schema, options)
                writer.write_batch(b)
                writer.close()
            outcomes["ok"] += 1
        except flight.FlightTimedOutError as exc:
            pytest.fail(f"a fuzzed {kind} hung: {exc}")
        except flight.FlightError as exc:
            assert "Python exception" not in str(exc) and "Traceback" not in str(exc), \
                f"a fuzzed {kind} hit an unhandled error: {str(exc)[:300]}"
            name = type(exc).__name__
            outcomes[name] = outcomes.get(name, 0) + 1
    assert outcomes.get("FlightUnauthenticatedError", 0) > 100 and outcomes.get("FlightServerError", 0) > 300
    # still serving, and correctly
    assert group.client(0).action("ping")["tables"] >= 1
    table = make_table(group, name="fit/after", rows=20, width=2)
    table.write(range(0, 20), np.arange(40.0).reshape(20, 2))
    assert np.array_equal(table.read(), np.arange(40.0).reshape(20, 2))


def test_oversized_tables_and_bad_write_schemas_are_refused_clearly(shards):
    _, group = shards
    with pytest.raises(ShardUnavailableError, match=r"does not fit in shard s0's available memory"):
        group.client(0).action("create_table", name="fit/huge", row_start=0, row_stop=10 ** 12, width=8)
    make_table(group, rows=10, width=3)
    with pytest.raises(ShardUnavailableError, match=r"a put stream must have the schema"):
        group.client(0).write_rows("put", "fit/t", None, np.ones((2, 4)), "float64", start=0)  # width 4 != 3


# ------------------------------------------------------------------------------------------------ TLS


@pytest.fixture(scope="module")
def certificates(tmp_path_factory):
    """A self-signed certificate for 127.0.0.1 and another, unrelated one (made by
    ``cryptography``, a dependency, as the shards make their per-run ones)."""
    from pystrads.ps.tls import self_signed

    out = tmp_path_factory.mktemp("tls")
    for name in ("shard", "other"):
        cert, key = self_signed("127.0.0.1")
        (out / f"{name}.pem").write_bytes(cert)
        (out / f"{name}.key").write_bytes(key)
    return out


def test_tls_shard_serves_trusting_clients_only(certificates):

    cert, key = (certificates / "shard.pem").read_bytes(), (certificates / "shard.key").read_bytes()
    server = ShardServer("grpc+tls://127.0.0.1:0", TOKEN, 1e9, "tls",
                         tls_certificates=[flight.CertKeyPair(cert, key)])
    try:
        info = ShardInfo("127.0.0.1", server.port, 0, "exec", "tls", tls=True)
        assert info.uri.startswith("grpc+tls://")
        group = ShardGroup([info], TOKEN, tls_root_certs=cert)
        table = make_table(group, rows=50, width=2)
        table.write(np.arange(50), np.arange(100.0).reshape(50, 2))
        assert np.array_equal(table.read(range(0, 50)), np.arange(100.0).reshape(50, 2))
        # a client trusting another certificate, and a plaintext client, get nothing
        distrust = ShardClient(info.uri, TOKEN, tls_root_certs=(certificates / "other.pem").read_bytes())
        with pytest.raises(ShardUnavailableError):
            distrust.action("ping")
        plain = ShardClient(f"grpc://127.0.0.1:{server.port}", TOKEN)
        with pytest.raises(ShardUnavailableError):
            plain.action("ping")
    finally:
        server.shutdown()


def test_a_mutual_tls_shard_serves_only_clients_with_the_runs_certificate(certificates):
    """Mutual TLS: a client that trusts the shard but lacks the run's client certificate (or holds
    another) cannot complete a handshake, token or not; the run's clients are served."""

    from pystrads.ps.tls import client_identity

    cert, key = (certificates / "shard.pem").read_bytes(), (certificates / "shard.key").read_bytes()
    run_client, stranger = client_identity(), client_identity()
    server = ShardServer("grpc+tls://127.0.0.1:0", TOKEN, 1e9, "mtls", tls_certificates=[flight.CertKeyPair(cert, key)],
                         client_cert=run_client[0])
    try:
        info = ShardInfo("127.0.0.1", server.port, 0, "exec", "mtls", tls=True)
        group = ShardGroup([info], TOKEN, tls_root_certs=cert, client_cert=run_client)
        table = make_table(group, rows=20, width=2)
        table.write(np.arange(20), np.ones((20, 2)))
        assert table.read(range(0, 20)).sum() == 40.0
        shipped = __import__("pickle").loads(__import__("pickle").dumps(group))  # as tasks get it
        assert shipped.client_cert == run_client and shipped.client(0).action("ping")["shard"] == "mtls"
        for identity in (None, stranger):
            client = ShardClient(info.uri, TOKEN, tls_root_certs=cert, client_cert=identity)
            with pytest.raises(ShardUnavailableError):
                client.action("ping")
    finally:
        server.shutdown()


def test_tls_settings_are_checked_before_any_shard_starts(tmp_path):
    from pystrads.config import Config
    from pystrads.errors import ConfigurationError
    from pystrads.ps.launcher import tls_files

    assert tls_files(Config.resolve({}, {})) == ("", "", None)
    with pytest.raises(ConfigurationError, match="certFile and spark.pystrads.shard.tls.keyFile go together"):
        tls_files(Config.resolve({}, {"shard.tls.certFile": str(tmp_path / "c.pem")}))
    with pytest.raises(ConfigurationError, match=r"tls.keyFile='/nonexistent/k.pem' is not a readable file"):
        (tmp_path / "c.pem").write_text("x")
        tls_files(Config.resolve({}, {"shard.tls.certFile": str(tmp_path / "c.pem"),
                                      "shard.tls.keyFile": "/nonexistent/k.pem"}))


def test_a_released_fit_tells_its_late_workers_to_end(shards):
    """A fit whose tables are dropped before a worker read ``finish`` must not leave that
    worker's task waiting (and holding its task slot) for commands that never come."""
    _, group = shards
    hub = group.client(0)
    hub.action("hello", namespace="fitA", worker=0, task=1)
    hub.action("post", namespace="fitA", command={"kind": "finish", "step": 3})
    waiting = {}

    def worker1():  # polls with a long timeout, as a task does between steps
        t0 = __import__("time").monotonic()
        waiting["answer"] = group.client(0).action("next", namespace="fitAB", worker=1, task=2, timeout=30.0)
        waiting["s"] = __import__("time").monotonic() - t0

    t = threading.Thread(target=worker1)
    t.start()
    group.broadcast("drop_tables", prefix="fitAB/")  # another fit, whose name extends fitA's
    t.join(timeout=10)
    assert not t.is_alive() and waiting["answer"] == {"kind": "closed"} and waiting["s"] < 5, waiting
    # fitA is untouched by fitAB's release: its worker still reads ``finish``
    assert hub.action("next", namespace="fitA", worker=0, task=1, timeout=1.0)["kind"] == "finish"
    group.broadcast("drop_tables", prefix="fitA/")
    assert hub.action("next", namespace="fitA", worker=0, task=1, timeout=5.0) == {"kind": "closed"}
    with pytest.raises(ShardUnavailableError, match="fitA.*has ended"):
        hub.action("hello", namespace="fitA", worker=1, task=3)


def test_a_relaunched_job_counts_only_its_own_hellos_and_its_steps_go_to_its_own_tasks(shards):
    """A relaunch of a fit's job (launch 2) while a task of launch 1 still runs (Spark kills a
    cancelled job's Python workers only after a while): launch 1's hellos do not make launch 2's
    complete, launch 1's task neither says hello again nor takes launch 2's step (entering it
    would roll the step back under launch 2's tasks), and launch 2's own task enters it."""
    _, group = shards
    hub = group.client(0)
    hub.action("hello", namespace="fitL", worker=0, task=1, launch=1)  # worker 1 of launch 1 was lost
    assert not hub.action("wait_hellos", namespace="fitL", num_workers=1, launch=2, timeout=0.2)["complete"]
    hub.action("hello", namespace="fitL", worker=1, task=4, launch=2)
    answer = hub.action("wait_hellos", namespace="fitL", num_workers=2, launch=2, timeout=0.2)
    assert not answer["complete"] and set(answer["hellos"]) == {"1"}, answer
    with pytest.raises(ShardUnavailableError, match="launch 1 of the fit's job, which launch 2 replaced"):
        hub.action("hello", namespace="fitL", worker=0, task=1, launch=1)
    group.broadcast("begin_step", step=0, num_workers=2, namespace="fitL")
    hub.action("post", namespace="fitL", command={"kind": "step", "step": 0, "init": True, "launch": 2})
    with pytest.raises(ShardUnavailableError, match="zombie"):
        hub.action("next", namespace="fitL", worker=0, task=1, launch=1, timeout=0.2)
    hub.action("hello", namespace="fitL", worker=0, task=3, launch=2)
    answer = hub.action("wait_hellos", namespace="fitL", num_workers=2, launch=2, timeout=0.2)
    assert answer["complete"] and {h["task"] for h in answer["hellos"].values()} == {3, 4}, answer
    assert hub.action("next", namespace="fitL", worker=1, task=4, launch=2, timeout=1.0)["step"] == 0
    assert hub.action("next", namespace="fitL", worker=0, task=3, launch=2, timeout=1.0)["step"] == 0
    # both of launch 2's tasks entered the step without rolling it back: their fences hold
    for worker, task in ((0, 3), (1, 4)):
        hub.action("tick", namespace="fitL", step=0, worker=worker, task=task, round=0, wait_for=-1)


def test_a_small_snapshot_rides_the_poll_that_says_its_step_is_done(shards):
    """The poll carrying a worker's ``done`` stores its small state snapshot first, under the
    step's fence and dropping the series' older ones, so the step is done only with its
    snapshot kept; a zombie task's poll stores nothing and is not counted done."""
    import base64

    _, group = shards
    hub = group.client(0)
    group.broadcast("begin_step", step=3, num_workers=2, namespace="fitS")
    hub.action("post", namespace="fitS", command={"kind": "step", "step": 3})
    for worker, task in ((0, 5), (1, 6)):
        assert hub.action("next", namespace="fitS", worker=worker, task=task, timeout=1.0)["step"] == 3
    hub.put_blob("fitS/state/0/1", b"old", dict(namespace="fitS", step=3, worker=0, task=5))
    series = dict(drop_prefix="fitS/state/0/", keep_after=2)
    snap = dict(series, key="fitS/state/0/3", blob=base64.b64encode(b"state of step 3").decode())
    fence = dict(namespace="fitS", step=3, worker=0, task=5)
    with pytest.raises(ShardUnavailableError, match="snapshot's blob is not base64"):
        hub.action("next", namespace="fitS", worker=0, task=5, done_step=3, timeout=0.0, done=fence,
                   snapshot=dict(snap, blob="not base64!"))
    zombie = dict(fence, task=4)
    with pytest.raises(ShardUnavailableError, match="zombie|older|replaced"):
        hub.action("next", namespace="fitS", worker=0, task=4, done_step=3, timeout=0.0, done=zombie,
                   snapshot=dict(snap, blob=base64.b64encode(b"a zombie's").decode()))
    assert hub.get_blob("fitS/state/0/3") is None
    assert hub.action("wait_step", namespace="fitS", step=3, timeout=0.0)["finished"] == []
    assert hub.action("next", namespace="fitS", worker=0, task=5, done_step=3, timeout=0.0, done=fence,
                      snapshot=snap)["kind"] == "wait"
    assert hub.get_blob("fitS/state/0/3") == b"state of step 3"
    assert hub.get_blob("fitS/state/0/1") is None  # older than keep_after: dropped
    assert hub.action("wait_step", namespace="fitS", step=3, timeout=0.0)["finished"] == [0]


def test_a_workers_poll_for_its_next_command_rides_its_rounds_stream(shards):
    """With the rounds streams on, ``next`` travels on the stream (no call of its own) and
    answers as the call does, refusals included; other actions are not served there."""
    from pystrads.ps import protocol

    _, group = shards
    hub = group.client(0)
    group.broadcast("begin_step", step=0, num_workers=1, namespace="fitP")
    hub.action("post", namespace="fitP", command={"kind": "step", "step": 0, "init": True})
    group.stream_rounds(True)
    try:
        before = hub.action("stats")["round_streams"]
        assert hub.poll("next", namespace="fitP", worker=0, task=3, timeout=1.0)["step"] == 0
        assert hub.poll("next", namespace="fitP", worker=0, task=3, done_step=0, timeout=0.0)["kind"] == "wait"
        with pytest.raises(ShardUnavailableError, match="replaced by a newer attempt"):
            hub.poll("next", namespace="fitP", worker=0, task=2, done_step=0, timeout=0.0)
        assert hub.poll("next", namespace="fitP", worker=0, task=3, done_step=0, timeout=0.0)["kind"] == "wait"
        assert hub.action("stats")["round_streams"] - before == 2  # the refusal ended the first stream
        assert "tick" not in protocol.STREAM_ACTIONS
        assert "committed" in hub.poll("tick", namespace="fitP", step=0, worker=0, task=3, round=0, wait_for=-1)  # a call
        # a worker's plain tick (no contribution, no write for that shard) rides its stream too
        other = group.client(1)
        opened = other.action("stats")["round_streams"]
        fence = dict(namespace="fitP", step=0, worker=0, task=3, enter=True, wait_for=-1, timeout=5)
        for rnd in (1, 2):
            group.exchange_round({0: dict(fence, round=rnd), 1: dict(fence, round=rnd)}, [])
        assert other.action("stats")["round_streams"] - opened == 1  # one stream for both rounds, no call
    finally:
        group.stream_rounds(False)


@pytest.mark.parametrize("streamed", [False, True])
def test_small_writes_held_in_push_ride_the_tick_in_order_and_fenced(shards, streamed):
    """A worker's small writes made while its handles hold them travel with the round's tick
    (no call of their own) and are applied before it, in the order made (a put after an add
    wins); a read through the step's handles sends them first (a worker reads its own writes);
    a write too big to hold, or made on another thread, sends what is held first; a zombie
    task's held writes are refused with its tick."""
    from pystrads.ps.client import RidingWrites

    _, group = shards
    table = make_table(group, "fitW/t", rows=10, width=2)
    group.broadcast("begin_step", step=1, num_workers=1, namespace="fitW")
    fence = dict(namespace="fitW", step=1, worker=0, task=7, enter=True)
    riding = RidingWrites(limit=128)
    handle = table.fenced(riding=riding, **fence)
    requests = lambda: sum(group.client(i).action("stats")["requests"] for i in range(2))  # noqa: E731
    group.stream_rounds(streamed)
    try:
        riding.hold(True)
        handle.add([1, 8, 1], [[1, 1], [2, 2], [3, 3]])  # repeated keys add up; two shards
        handle.write([8], [[5, 6]])  # a put after the add: the put wins
        keys = np.array([4]); rows = np.array([[7.0, 7.0]])
        handle.add(keys, rows)
        keys[0], rows[0, 0] = 9, -1.0  # the caller reuses its arrays: what is held does not change
        before = requests()
        held = riding.take()
        assert sorted(held) == [0, 1] and [w[1] for w in held[1]] == ["inc", "put"]
        heads = {i: dict(fence, round=0, wait_for=0, timeout=5) for i in range(2)}
        group.exchange_round(heads, [], held)
        assert requests() - before == 2 + 2  # one exchange per shard (and the two stats calls)
        np.testing.assert_array_equal(table.read()[[1, 4, 8]], [[4, 4], [7, 7], [5, 6]])
        handle.add([2], [[1, 1]])
        np.testing.assert_array_equal(handle.read([2]), [[1, 1]])  # its own write, sent by the read
        handle.add([3], [[1, 1]])
        handle.add(range(0, 10), np.ones((10, 2)) * 100)  # over the limit: what is held goes first
        assert riding.take() == {}
        np.testing.assert_array_equal(table.read([2, 3])[:, 0], [101, 101])
        handle.add([5], [[1, 1]])
        other = threading.Thread(target=lambda: handle.write([5], [[9, 9]]))
        other.start(), other.join()
        np.testing.assert_array_equal(table.read([5]), [[9, 9]])  # the held add went before it
        handle.add([6], [[1, 1]])
        riding.hold(False)
        handle.add([7], [[1, 1]])  # not held any more: at once, after what was held
        np.testing.assert_array_equal(table.read([6, 7])[:, 0], [101, 101])
        # a zombie (an older task) holds a write: refused with its tick, nothing applied
        riding.hold(True)
        zombie = table.fenced(riding=riding, **dict(fence, task=6))
        zombie.add([0], [[50, 50]])
        with pytest.raises(ShardUnavailableError, match="zombie|older|replaced"):
            group.exchange_round({0: dict(fence, task=6, round=1, wait_for=-1, timeout=5)}, [], riding.take())
        assert table.read([0])[0, 0] == 100
    finally:
        group.stream_rounds(False)


def test_held_writes_that_do_not_match_their_table_are_refused_by_name(shards):
    from pystrads.ps import protocol

    _, group = shards
    make_table(group, "fitM/t", rows=4, width=2)
    group.broadcast("begin_step", step=1, num_workers=1, namespace="fitM")
    fence = dict(namespace="fitM", step=1, worker=0, task=1, round=0, wait_for=-1, timeout=5)
    with pytest.raises(ShardUnavailableError, match="'fitM/t': a write of 3 float64 columns, the table has 2"):
        group.client(0).exchange_round(fence, writes=[("fitM/t", "inc", np.array([0]), np.ones((1, 3)))])
    fields, payload = protocol.riding_payload([("fitM/t", "inc", np.array([0]), np.ones((1, 2)))])
    with pytest.raises(ValueError, match="payload is shorter"):
        list(protocol.riding_writes(fields, payload[:-1]))
    with pytest.raises(ValueError, match="malformed write"):
        list(protocol.riding_writes([["fitM/t", "drop", 1, 2, "float64", None]], payload))


# ------------------------------------------------------------------ addresses and ports


def test_shard_addresses_never_pick_a_loopback_when_the_driver_is_elsewhere(monkeypatch):
    import socket

    from pystrads.errors import ShardStartError
    from pystrads.ps import launcher

    monkeypatch.delenv("SPARK_LOCAL_IP", raising=False)
    # a Debian/Ubuntu host: its name resolves to 127.0.1.1
    monkeypatch.setattr(socket, "getfqdn", lambda *a: "node7")
    real = socket.gethostbyname
    monkeypatch.setattr(socket, "gethostbyname", lambda h: "127.0.1.1" if h == "node7" else real(h))
    monkeypatch.setattr(launcher, "address_toward", lambda peer: {"10.0.0.2": "10.0.0.7"}.get(peer))
    assert launcher.shard_addresses(False, "", "10.0.0.2") == ("10.0.0.7", "10.0.0.7")  # the route to the driver
    assert launcher.shard_addresses(False, "0.0.0.0", "10.0.0.2") == ("0.0.0.0", "10.0.0.7")  # advertised: routable
    assert launcher.shard_addresses(False, "10.9.9.9", "10.0.0.2") == ("10.9.9.9", "10.9.9.9")  # set: it wins
    assert launcher.shard_addresses(True, "", "10.0.0.2") == ("127.0.0.1", "127.0.0.1")  # local mode
    monkeypatch.setenv("SPARK_LOCAL_IP", "10.0.0.8")
    assert launcher.shard_addresses(False, "", "10.0.0.2") == ("10.0.0.8", "10.0.0.8")  # Spark's own choice
    monkeypatch.delenv("SPARK_LOCAL_IP")
    # no route to the driver and only the loopback name: refused, saying what to set
    with pytest.raises(ShardStartError, match="spark.pystrads.shard.bindHost") as err:
        launcher.shard_addresses(False, "", "10.0.0.99")
    assert "127.0.1.1" in str(err.value) and "10.0.0.99" in str(err.value)
    # a driver on this host's loopback (a one-machine cluster): the loopback is right
    assert launcher.shard_addresses(False, "", "127.0.0.1")[1] == "127.0.1.1"


def test_address_toward_reports_the_local_end_of_the_route():
    from pystrads.ps import launcher

    assert launcher.address_toward("127.0.0.1") == "127.0.0.1"
    assert launcher.address_toward("no-such-host.invalid") is None


def test_a_shard_takes_the_first_free_port_of_its_range():
    import socket

    from pystrads.ps.server import _listen

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        base = probe.getsockname()[1]
    taken = socket.socket()
    taken.bind(("127.0.0.1", base))
    taken.listen()
    try:
        server = _listen("127.0.0.1", base, 8, "t", 1e9, "s", None)  # (a lease that never lapses here)
        try:
            assert base < server.port < base + 8
        finally:
            server.shutdown()
        with pytest.raises(OSError, match="shard.port"):
            _listen("127.0.0.1", base, 1, "t", 1e9, "s", None)
    finally:
        taken.close()


@pytest.mark.parametrize("dtype,max_fill", [("int32", 0.25), ("int32", 0.0), ("int32", 1.0), ("float64", 0.25)])
def test_sparse_table_equals_a_dense_one_under_any_sequence_of_writes_and_rollbacks(dtype, max_fill):
    """A sparse table (rows as pairs, dense past ``max_fill``, moved, promoted, compacted) holds
    exactly what a dense table holds after the same random adds, puts, entry writes (replacing
    or adding, keys repeated or not), undo-log saves, rollbacks and compactions."""
    from pystrads.kernels.rows import to_csr
    from pystrads.ps.table import ShardTable, SparseShardTable

    rng = np.random.default_rng(int(max_fill * 100))
    n, w = 60, 12
    dense = ShardTable("t", 100, 100 + n, w, dtype, np.zeros((n, w), dtype), w)
    sparse = SparseShardTable("t", 100, 100 + n, w, dtype, w, max_fill)
    for it in range(2500):
        op = int(rng.integers(0, 7))
        if rng.random() < 0.1:
            start = int(rng.integers(0, n - 5))
            index = slice(start, start + 5)
        elif rng.random() < 0.7:
            index = np.sort(rng.choice(n, int(rng.integers(1, 8)), replace=False))
        else:
            index = rng.integers(0, n, int(rng.integers(1, 8)))  # repeated, unsorted
        m = 5 if isinstance(index, slice) else len(index)
        block = ((rng.random((m, w)) < rng.random()) * rng.integers(-3, 4, (m, w))).astype(dtype)
        repeated = not isinstance(index, slice) and len(np.unique(index)) < len(index)
        for table in (dense, sparse):
            if op == 0:
                table.add(index, block)
            elif op == 1 and not repeated:
                table.write(index, block)
            elif op in (2, 6) and not (op == 6 and repeated):
                table.add_entries(index, *to_csr(block), replace=op == 6)
            elif op == 3:
                table.remember(index if isinstance(index, slice) else np.asarray(index))
        if op == 4 and rng.random() < 0.1:
            assert dense.rollback() == sparse.rollback()
        elif op == 5 and rng.random() < 0.1:
            dense.forget()
            sparse.forget()
            sparse.settle()
        assert np.array_equal(sparse.read(slice(0, n)), dense.values), (it, op)
        if it % 50 == 0:
            for a, b in zip(dense.read_entries(slice(0, n)), sparse.read_entries(slice(0, n))):
                assert np.array_equal(a, b)
            assert np.array_equal(dense.nonzero_rows(3, n), sparse.nonzero_rows(3, n))
            assert np.array_equal(sparse.nnz, np.count_nonzero(dense.values, axis=1))  # each row's count
    sparse.compact()
    assert np.array_equal(sparse.read(slice(0, n)), dense.values)
    info = sparse.storage()
    assert info["nonzeros"] == np.count_nonzero(dense.values)
    if max_fill == 0.0:
        assert info["pair_entries"] == 0  # every non-empty row dense
    if max_fill == 1.0:
        assert info["dense_rows"] == 0  # every row as pairs


def test_a_sparse_tables_memory_follows_its_non_zeros(shards):
    """A mostly-empty sparse table of 200 k rows x 1000 int32 holds its non-zeros (pairs for
    the light rows, dense rows for the full ones), not 800 MB; the stats name its storage, and
    as its rows empty out, a step's commit gives the memory back."""
    servers, group = shards
    rows, width = 200_000, 1000
    table = make_table(group, rows=rows, width=width, dtype="int32", storage="sparse", max_fill=0.25)
    rng = np.random.default_rng(0)
    keys = np.unique(rng.integers(0, rows, 20_000))
    block = np.zeros((len(keys), width), np.int32)
    block[np.arange(len(keys)), rng.integers(0, width, len(keys))] = 3
    block[:400] = 1  # 400 full rows: stored dense
    table.add(keys, RowEntries.from_rows(block))
    nnz = int(np.count_nonzero(block))
    stats = [s.action_stats(None)["tables"]["fit/t"] for s in servers]
    assert sum(t["nonzeros"] for t in stats) == nnz
    assert sum(t["dense_rows"] for t in stats) == 400
    held = sum(t["bytes"] for t in stats)
    assert held < 24 * rows + 400 * width * 4 * 2 + 40 * nnz, held  # not rows x width x 4 = 800 MB
    assert np.array_equal(table.read_entries(keys).toarray(), block)
    # the full rows empty out inside a step: at its commit the dense rows go back to pairs
    group.broadcast("begin_step", step=1, num_workers=1, namespace="fit")
    fence = _enter(group, 1, 0, task=1)
    minus = np.full((400, width), -1, np.int32)
    minus[:, 0] = 0
    table.fenced(**fence).add(keys[:400], RowEntries.from_rows(minus))
    group.broadcast("commit_step", step=1)
    stats = [s.action_stats(None)["tables"]["fit/t"] for s in servers]
    assert sum(t["dense_rows"] for t in stats) == 0
    assert sum(t["bytes"] for t in stats) < held - 400 * width * 4
    block[:400] += minus
    assert np.array_equal(table.read(keys), block)
    assert np.array_equal(table.read_entries(range(0, rows)).keys, keys)


def test_entries_travel_across_shards_and_a_blocks_delta_is_exact(shards, storage):
    """``read_entries`` gives the rows at sorted keys (over both shards, many batches) as their
    CSR entries; ``csr_delta`` of a changed block against them, sent by ``add``, makes the table
    equal the block, sending only the rows that changed."""
    from pystrads.kernels.rows import csr_delta, csr_into

    servers, group = shards
    table = make_table(group, rows=3000, width=40, dtype="int32", storage=storage, max_fill=0.25)
    rng = np.random.default_rng(5)
    base = ((rng.random((3000, 40)) < 0.1) * rng.integers(1, 9, (3000, 40))).astype(np.int32)
    base[7] = 3  # a full row
    table.write(np.arange(3000), RowEntries.from_rows(base))
    keys = np.unique(rng.integers(0, 3000, 900))
    got = table.read_entries(keys)
    entries = got.csr
    block = np.empty((len(keys), 40), np.int32)
    csr_into(*entries, block, 0)
    assert np.array_equal(block, base[keys]) and np.array_equal(got.keys, keys)
    assert entries[0].dtype == np.int64 and len(entries[0]) == len(keys) + 1
    changed = rng.choice(len(keys), 100, replace=False)
    block[changed[:10]] = 0
    block[changed, rng.integers(0, 40, 100)] += 10  # every one of them differs from before
    rows, offsets, cols, vals = csr_delta(block, *entries)
    assert np.array_equal(rows, np.sort(changed))
    before = sum(s.state.counters()["rows_in"] for s in servers)
    table.add(keys[rows], RowEntries(offsets, cols, vals, 40))
    assert sum(s.state.counters()["rows_in"] for s in servers) - before == 100
    want = base.copy()
    want[keys] = block
    assert np.array_equal(table.read(), want)
    with pytest.raises(ValueError, match="strictly increasing"):
        table.add(keys[rows][::-1], RowEntries(offsets, cols, vals, 40))


def test_nonzero_entry_reads_send_the_nonzero_rows_entries_with_their_keys(shards, storage):
    """``read_entries`` of a range gives the rows that hold a non-zero value, with their keys, as
    their entries, across both shards and many batches."""
    from pystrads.kernels.rows import csr_into

    servers, group = shards
    table = make_table(group, rows=20000, width=30, dtype="int32", storage=storage)
    rng = np.random.default_rng(9)
    keys = np.unique(rng.integers(0, 20000, 3000))
    rows = ((rng.random((len(keys), 30)) < 0.1) * rng.integers(1, 5, (len(keys), 30))).astype(np.int32)
    rows[:, 0] += 1  # every row non-zero
    table.write(keys, RowEntries.from_rows(rows))
    for lo, hi in ((0, 20000), (5000, 15000), (0, 0)):
        got = table.read_entries(range(lo, hi))
        sub = (keys >= lo) & (keys < hi)
        assert np.array_equal(got.keys, keys[sub])
        block = np.empty((len(got.keys), 30), np.int32)
        csr_into(*got.csr, block, 0)
        assert np.array_equal(block, rows[sub])


def test_two_fits_step_at_once_each_with_its_own_fence_clocks_and_undo_log(shards, storage):
    """Each fit (namespace) has its own step: two steps open at once on the same shards, a retry of
    one rolls back only its tables, one commits while the other aborts, and each round's
    contributions and clocks stay with their fit."""
    _, group = shards
    a = make_table(group, name="fa/t", rows=40, width=1, dtype="int64", storage=storage)
    b = make_table(group, name="fb/t", rows=40, width=1, dtype="int64", storage=storage)
    a.write(np.arange(40), np.zeros((40, 1), dtype=np.int64))
    b.write(np.arange(40), np.zeros((40, 1), dtype=np.int64))
    for ns in ("fa", "fb"):
        group.broadcast("begin_step", step=3, num_workers=1, namespace=ns)

    def enter(ns, task):
        fence = {"step": 3, "worker": 0, "task": task, "namespace": ns}
        for i in range(len(group.shards)):
            group.client(i).action("enter", **fence)
        return fence

    fa, fb = enter("fa", 20), enter("fb", 21)
    a.fenced(**fa).add(np.arange(0, 40, 3), np.ones((14, 1), dtype=np.int64))
    b.fenced(**fb).add(np.arange(40), np.full((40, 1), 2, dtype=np.int64))
    with pytest.raises(ShardUnavailableError, match="unfenced write while step 3 is open"):
        a.add([0], [[1]])  # the fit's own step is open: its table takes fenced writes only
    with pytest.raises(ShardUnavailableError, match="2 fits have a step open; the request must name"):
        group.client(0).action("metrics")
    fa2 = enter("fa", 22)  # fa's stage is retried: only fa's rows roll back
    assert a.read()[:, 0].sum() == 0 and b.read()[:, 0].sum() == 80
    with pytest.raises(ShardUnavailableError, match="zombie|failed attempt"):
        a.fenced(**fa).add([1], [[1]])
    a.fenced(**fa2).add([5], [[7]])
    for i in range(len(group.shards)):  # a round of each fit, ticked independently
        group.client(i).action("tick", **fb, round=0, wait_for=0, timeout=10, metrics={"n": 2.0} if i == 0 else None)
        group.client(i).action("tick", **fa2, round=0, wait_for=0, timeout=10, metrics={"n": 1.0} if i == 0 else None)
    assert group.client(0).action("metrics", namespace="fa")["rounds"]["0"]["n"] == 1.0
    assert group.client(0).action("metrics", namespace="fb")["rounds"]["0"]["n"] == 2.0
    group.broadcast("commit_step", step=3, namespace="fb")
    restored = sum(r["restored_rows"] for r in group.broadcast("abort_step", step=3, namespace="fa"))
    assert restored >= 1 and a.read()[:, 0].sum() == 0
    assert b.read()[:, 0].sum() == 80
    a.add([0], [[1]])  # both closed: unfenced writes again
    assert a.read()[0, 0] == 1


def test_blobs_round_trip_exactly_and_a_snapshot_series_holds_two_at_most(shards):
    """A blob comes back byte for byte (several chunks, empty, absent: None); a worker's state
    snapshots (``drop_prefix`` / ``keep_after`` = step - 1) drop the older ones before the new
    one arrives, so the shard never holds more than two of the series; the stats account them."""
    from pystrads.ps import protocol

    servers, group = shards
    client = group.client(0)
    big = np.random.default_rng(0).bytes(3 * protocol.BLOB_CHUNK * 4 + 12345)  # 4 batches, the last short
    client.put_blob("fit/x", big)
    client.put_blob("fit/empty", b"")
    assert client.get_blob("fit/x") == big
    assert client.get_blob("fit/empty") == b""
    assert client.get_blob("fit/absent") is None

    before = client.action("stats")["blob_bytes"]
    assert before == len(big)
    size = 5 * protocol.BLOB_CHUNK + 7
    for step in range(4):
        client.put_blob(f"fit/state/0/{step}", bytes([step]) * size,
                        dict(drop_prefix="fit/state/0/", keep_after=step - 1))
    assert sorted(k for k in servers[0].state.blobs if k.startswith("fit/state/")) == ["fit/state/0/2", "fit/state/0/3"]
    assert client.get_blob("fit/state/0/2") == bytes([2]) * size
    stats = client.action("stats")
    assert stats["blob_bytes"] == before + 2 * size
    assert stats["peak_blob_bytes"] == before + 2 * size  # never three snapshots at once
    assert stats["peak_rss_bytes"] >= stats["rss_bytes"] > 0


def test_a_released_fit_gives_its_memory_back_to_the_kernel(tmp_path):
    """A shard process (malloc tuned as in a fit) that held 384 MiB of state snapshots returns
    it to the kernel when the fit is released: its resident memory falls by most of it, not
    just the part above glibc's trim threshold."""
    with _shard_process(tmp_path, "--malloc-retain", str(256 << 20)) as (shard, port):
        client = ShardClient(f"grpc://127.0.0.1:{port}", TOKEN)
        size = 64 << 20
        blob = np.random.default_rng(0).bytes(size)
        for worker in range(2):
            for step in range(5):  # three generations dropped on the way, two kept per worker
                client.put_blob(f"fit/state/{worker}/{step}", blob,
                                dict(drop_prefix=f"fit/state/{worker}/", keep_after=step - 1))
        held = client.action("stats")
        assert held["blob_bytes"] == 4 * size and held["peak_blob_bytes"] == 4 * size
        client.action("drop_tables", prefix="fit/")
        after = client.action("stats")
        assert after["blob_bytes"] == 0
        assert held["rss_bytes"] - after["rss_bytes"] >= 3 * size, (held["rss_bytes"], after["rss_bytes"])


def test_a_heartbeats_hold_keeps_a_shard_past_its_lease_and_no_longer(tmp_path):
    """A heartbeat with ``hold`` (as the client sends before relaunching a fit's job, whose
    coordinator beats only once it runs) keeps a shard with a 1 s lease alive for the hold, and it
    exits for want of heartbeats after it; a hold out of range is refused, naming it."""
    import time

    with _shard_process(tmp_path, lease=1.0) as (shard, port):
        client = ShardClient(f"grpc://127.0.0.1:{port}", TOKEN)
        with pytest.raises(ShardUnavailableError, match="hold=-1"):
            client.action("heartbeat", hold=-1)
        client.action("heartbeat", hold=4.0)
        held = time.monotonic()
        time.sleep(2.5)  # 2.5 leases without a heartbeat
        assert shard.poll() is None and client.action("ping")["pid"] == shard.pid
        shard.wait(10)
        assert shard.returncode == 3  # the lease watchdog's exit
        assert 4.0 <= time.monotonic() - held < 8.0
    with _shard_process(tmp_path, lease=1.0) as (shard, port):  # without a hold: gone within its lease
        ShardClient(f"grpc://127.0.0.1:{port}", TOKEN).action("heartbeat")
        beat = time.monotonic()
        shard.wait(10)
        assert shard.returncode == 3 and time.monotonic() - beat < 3.0


def test_a_liveness_check_asks_again_before_it_counts_a_shard_gone():
    """``ShardGroup.unreachable``: a shard whose port refuses the first ping but serves a moment
    later (a restarting network, a busy listener) is not counted gone; one that never answers is,
    after the retries (about 1.25 s), and a single try would have counted the first one gone."""
    import socket
    import time

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    started = []

    def serve_late():
        time.sleep(0.15)
        started.append(ShardServer(f"grpc://127.0.0.1:{port}", TOKEN, 1e9, "late"))

    group = ShardGroup([ShardInfo("127.0.0.1", port, 0, "exec", "late")], TOKEN)
    assert group.unreachable(attempts=1) == [0]  # nobody listens yet
    thread = threading.Thread(target=serve_late)
    thread.start()
    try:
        assert group.unreachable() == []
    finally:
        thread.join()
        for server in started:
            server.shutdown()
    t0 = time.monotonic()
    assert group.unreachable() == [0]  # gone for good now
    assert 1.2 <= time.monotonic() - t0 < 10


@contextlib.contextmanager
def _shard_process(tmp_path, *args, lease=600.0, env=None, info_out=None):
    """A shard server process of its own (``args``: more of its flags, ``env``: more of its
    environment): ``(process, port)``; ``info_out`` (a dict) gets its whole info file."""
    import json
    import os
    import subprocess
    import sys
    import time

    info = tmp_path / "shard.json"
    info.unlink(missing_ok=True)
    shard = subprocess.Popen([sys.executable, "-m", "pystrads.ps.server", "--lease", str(lease), "--info-file", str(info),
                              *args], env=dict(os.environ, PYSTRADS_SHARD_TOKEN=TOKEN, **(env or {})),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 60
        while not info.exists() and time.time() < deadline and shard.poll() is None:
            time.sleep(0.1)
        if info_out is not None:
            info_out.update(json.loads(info.read_text()))
        yield shard, json.loads(info.read_text())["port"]
    finally:
        shard.kill()
        shard.wait(10)


def test_arrays_built_and_read_through_their_buffers_equal_pyarrows_own():
    import pyarrow as pa

    from pystrads.ps import protocol

    rng = np.random.default_rng(3)
    for values in (rng.normal(size=7), rng.integers(-9, 9, 11).astype(np.int32), np.arange(5, dtype=np.int64),
                   rng.random(9) > 0.5, np.zeros(0), np.zeros(0, dtype=bool), rng.normal(size=4).astype(np.float32)):
        built = protocol.numbers(values)
        assert built.equals(pa.array(values)), values
        for array in (built, built.slice(1), built.slice(2, 3), pa.chunked_array([built, built.slice(1)]),
                      pa.chunked_array([], built.type)):
            got, want = protocol.numpy_of(array), array.to_numpy(zero_copy_only=False)
            assert got.dtype == want.dtype and np.array_equal(got, want), (array, got, want)
    assert protocol.numbers([1.5, 2.5], pa.float32()).type == pa.float32()
    with_nulls = pa.array([1, None, 3], pa.int64())
    assert np.array_equal(protocol.numpy_of(with_nulls), with_nulls.to_numpy(zero_copy_only=False), equal_nan=True)
    for array in (with_nulls, with_nulls.slice(1), pa.array([True, None, False]), pa.array([2.5, None]).slice(1)):
        want = array.fill_null(pa.scalar(7, array.type) if not pa.types.is_boolean(array.type) else True)
        fill = True if pa.types.is_boolean(array.type) else 7
        assert np.array_equal(protocol.numpy_filled(array, fill), want.to_numpy(zero_copy_only=False)), array
    lists = pa.array([[1, 2], None, [3]], pa.list_(pa.int64())).slice(1)
    assert np.array_equal(protocol.offsets_of(lists), lists.offsets.to_numpy())
    items = [b"ab", memoryview(b"cde")[1:], b""]
    assert protocol.binary_array(items).to_pylist() == [b"ab", b"de", b""]
    with pytest.raises(ValueError, match="1-D"):
        protocol.numbers(np.zeros((2, 2)))


#: worker-side work in a fresh interpreter, against a shard process: every kind of request, and
#: the estimators' decoding of Arrow batches; prints whether pandas got imported
_WORKER_SIDE_WITHOUT_PANDAS = r'''
import sys
import numpy as np
import pyarrow.flight as flight
import pyarrow as pa
from pystrads.ps.client import ShardClient
from pystrads.ps import protocol
from pystrads.ml._lda_data import _kept_batch, doc_blocks
from pystrads.ml._mf_data import dense_ids, _factors_batch, _features
from pystrads.ml._linear_input import _arrow_block
from pystrads.ml._arrow import vectors, dense_vectors

client = ShardClient(sys.argv[1], sys.argv[2], chunk_bytes=4096)
for storage in ("dense", "sparse"):
    name = f"fit/{storage}"
    client.action("create_table", name=name, row_start=0, row_stop=100, width=4, dtype="float64",
                  contrib_width=4, storage=storage, max_fill=0.5)
    rows = np.zeros((100, 4)); rows[::3, 1] = 2.0
    client.write_rows("put", name, np.arange(100, dtype=np.int64), rows, "float64")
    assert np.array_equal(client.get_rows(name, 4, "float64", np.arange(100, dtype=np.int64)), rows)
    got = client.get_entries(name, 4, "float64", start=0, stop=100)
    assert np.array_equal(got.keys, np.arange(0, 100, 3))
    assert np.array_equal(got.cols, np.ones(34)) and np.array_equal(got.vals, np.full(34, 2.0))
    client.write_entries("inc", name, np.array([1, 2], dtype=np.int64), np.array([0, 1, 2]), np.array([0, 3], np.int32),
                         np.array([1.0, 5.0]), "float64")
    got = client.get_entries(name, 4, "float64", keys=np.array([1, 2], dtype=np.int64))
    assert np.array_equal(got.cols, [0, 3]) and np.array_equal(got.vals, [1.0, 5.0])
blob = np.random.default_rng(0).bytes(5 << 20)
client.put_blob("fit/state/0/0", blob)
assert client.get_blob("fit/state/0/0") == blob

struct = pa.struct([("type", pa.int8()), ("size", pa.int32()), ("indices", pa.list_(pa.int32())),
                    ("values", pa.list_(pa.float64()))])
sparse = pa.StructArray.from_arrays([protocol.numbers(np.zeros(2, np.int8)), protocol.numbers(np.full(2, 6, np.int32)),
                                     pa.ListArray.from_arrays(protocol.numbers(np.array([0, 2, 3], np.int32)),
                                                              protocol.numbers(np.array([1, 4, 5], np.int32))),
                                     pa.ListArray.from_arrays(protocol.numbers(np.array([0, 2, 3], np.int32)),
                                                              protocol.numbers(np.array([2.0, 1.0, 3.0])))],
                                    fields=list(struct))
dense = dense_vectors(np.array([[0.0, 2.0, 1.0]]), struct)
assert [v[0] for v in vectors(sparse)] == [6, 6] and list(next(vectors(dense))[1]) == [1, 2]
kept = _kept_batch(pa.RecordBatch.from_arrays([sparse, protocol.numbers(np.array([False, True]))], ["f", "v"]), True)
blocks = doc_blocks(kept)
assert blocks[0].validation.tolist() == [False, True] and blocks[0].lengths.tolist() == [2, 1]
ratings = pa.RecordBatch.from_arrays([protocol.numbers(np.array([1.0, 2.0])), protocol.numbers(np.array([5.0, 6.0])),
                                      protocol.numbers(np.array([3.0, 4.0])), protocol.numbers(np.array([False, True]))],
                                     ["u", "i", "r", "v"])
block = dense_ids(np.array([1, 2], np.int32), np.array([5, 6], np.int32), ratings)[0]
batch = _factors_batch(np.array([7], np.int32), np.ones((1, 3)))
assert _features(batch.column(1), 1).shape == (1, 3)
linear = _arrow_block(pa.RecordBatch.from_arrays([protocol.numbers(np.array([1.0, 0.0])), protocol.numbers(np.ones(2)),
                                                  sparse], ["y", "w", "x"]))
assert linear["col_idx"].tolist() == [1, 4, 5]
print("pandas" in sys.modules)
'''


def test_the_worker_side_and_the_shard_run_without_pandas(tmp_path):
    """pyarrow's pa.array and Array.to_numpy import pandas, ~0.4 s of CPU in each new Python worker
    and shard: every request a worker makes of a shard, the shard's side of it and the
    estimators' decoding of Arrow batches go through the arrays' buffers instead."""
    import subprocess
    import sys

    with _shard_process(tmp_path) as (shard, port):
        out = subprocess.run([sys.executable, "-c", _WORKER_SIDE_WITHOUT_PANDAS, f"grpc://127.0.0.1:{port}", TOKEN],
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        assert out.stdout.strip() == "False", "a worker-side path imported pandas"
        maps = open(f"/proc/{shard.pid}/maps").read()
        assert "pandas" not in maps, "the shard imported pandas"


def test_a_stale_loop_epoch_is_refused_every_step_action_and_write(shards):
    """A coordinator kept alive after its replacement claimed a newer epoch: its begin_step,
    commit_step, abort_step, post, table writes, journal writes and the drop of the fit's tables
    (an in-job coordinator's end on an error) are refused, naming its epoch; the new one's go
    through."""
    servers, group = shards
    table = make_table(group, name="fit/t", rows=10, width=1)
    begin = dict(num_workers=1, namespace="fit")
    group.broadcast("begin_step", step=1, epoch=1, **begin)
    old = table.fenced(step=1, epoch=1, namespace="fit")
    old.add(np.arange(10), np.ones((10, 1)))  # the loop's own write, in its open step
    assert [a["epoch"] for a in group.broadcast("claim", namespace="fit", epoch=2)] == [2, 2]
    refused = [lambda: old.add(np.arange(10), np.ones((10, 1))),
               lambda: group.broadcast("commit_step", step=1, namespace="fit", epoch=1),
               lambda: group.broadcast("abort_step", step=1, namespace="fit", epoch=1),
               lambda: group.client(0).action("post", namespace="fit", command={"kind": "finish"}, epoch=1),
               lambda: group.client(0).put_blob("fit/loop/journal", b"x", {"step": 1, "epoch": 1, "namespace": "fit"}),
               lambda: group.broadcast("begin_step", step=2, epoch=1, **begin),
               lambda: group.broadcast("claim", namespace="fit", epoch=1),
               lambda: group.broadcast("drop_tables", prefix="fit/", epoch=1)]
    for call in refused:
        with pytest.raises(ShardUnavailableError, match="loop epoch 1 refused: epoch 2 has taken the fit over"):
            call()
    assert group.client(0).get_blob("fit/loop/journal") is None
    group.broadcast("abort_step", step=1, namespace="fit", epoch=2)  # the successor settles the step
    np.testing.assert_array_equal(table.read(), np.zeros((10, 1)))  # the old loop's write rolled back
    group.broadcast("begin_step", step=1, epoch=2, **begin)
    table.fenced(step=1, epoch=2, namespace="fit").add(np.arange(10), np.full((10, 1), 2.0))
    group.broadcast("commit_step", step=1, namespace="fit", epoch=2)
    np.testing.assert_array_equal(table.read(), np.full((10, 1), 2.0))


def test_a_commit_opens_the_next_step_and_settling_closes_what_it_left_on_each_shard(shards):
    """``commit_step`` with ``open_next`` keeps the step's writes and opens the next step in one
    call.  When it reached shard 0 only, ``settle`` decides each shard's open step by the journal:
    the journalled step commits where it is still open, the next one (never journalled) rolls
    back where it was opened."""
    from pystrads.engine.scheduler.journal import JournalEntry, settle

    servers, group = shards
    table = make_table(group, name="fit/t", rows=10, width=1)
    begin = dict(num_workers=1, namespace="fit", epoch=1)
    group.broadcast("begin_step", step=1, **begin)
    table.fenced(step=1, epoch=1, namespace="fit").add(np.arange(10), np.ones((10, 1)))
    following = {"step": 2, "num_workers": 1, "round_offset": 5}
    group.broadcast("commit_step", step=1, namespace="fit", epoch=1, open_next=following)
    assert [(s["step"], s["open"]) for s in group.broadcast("claim", namespace="fit", epoch=1)] == [(2, True)] * 2
    assert [s.fences.step_of("fit").round_offset for s in servers] == [5, 5]
    table.fenced(step=2, epoch=1, namespace="fit").add(np.arange(10), np.ones((10, 1)))
    # step 2 is journalled; its commit, opening step 3, reaches shard 0 only
    group.client(0).action("commit_step", step=2, namespace="fit", epoch=1, open_next=dict(following, step=3))
    table.fenced(step=3, epoch=1, namespace="fit").add(np.arange(5), np.ones((5, 1)))  # rows of shard 0
    told = settle(group, "fit", 2, JournalEntry(2, {}, {}, {}))
    assert told == "rolled back step 3 on shard 0; committed step 2 on shard 1 (its journal entry was written)"
    assert [(s["step"], s["open"], s["kept"]) for s in group.broadcast("claim", namespace="fit", epoch=2)] == \
        [(3, False, False), (2, False, True)]
    np.testing.assert_array_equal(table.read(), np.full((10, 1), 2.0))  # steps 1 and 2, not 3
    group.broadcast("begin_step", step=3, num_workers=1, namespace="fit", epoch=2)
    with pytest.raises(ShardUnavailableError, match="step 3 of fit 'fit' is still open"):  # not this step's commit
        group.client(0).action("commit_step", step=2, namespace="fit", epoch=2, open_next=dict(following, step=4))


def test_the_loops_writes_belong_to_the_open_step(shards):
    """Writes fenced with the loop's epoch are undone when the step is rolled back; one fenced
    with another step is refused; an unfenced write while a step is open is refused."""
    servers, group = shards
    table = make_table(group, name="fit/t", rows=6, width=1)
    group.broadcast("begin_step", step=4, num_workers=1, namespace="fit", epoch=1)
    table.fenced(step=4, epoch=1, namespace="fit").write(np.arange(6), np.full((6, 1), 7.0))
    with pytest.raises(ShardUnavailableError, match="wrote for step 3 but the open step is 4"):
        table.fenced(step=3, epoch=1, namespace="fit").write(np.arange(6), np.ones((6, 1)))
    with pytest.raises(ShardUnavailableError, match="unfenced write while step 4 is open"):
        table.write(np.arange(6), np.ones((6, 1)))
    group.broadcast("abort_step", step=4, namespace="fit", epoch=1)
    np.testing.assert_array_equal(table.read(), np.zeros((6, 1)))


def test_a_shard_that_misses_its_deadline_is_lost_and_delays_no_other_heartbeat(shards, monkeypatch):
    """A shard whose handlers stop answering (a frozen process): a control call fails after its
    deadline naming the shard, later calls fail at once, and heartbeats to the other shard still
    arrive at every beat."""
    import time

    servers, _ = shards
    frozen = threading.Event()
    original = ShardServer.action_heartbeat

    def heartbeat(self, req):
        if self is servers[1] and frozen.is_set():
            time.sleep(5)
        return original(self, req)

    monkeypatch.setattr(ShardServer, "action_heartbeat", heartbeat)
    monkeypatch.setattr(ShardServer, "action_ping", lambda self, req: (time.sleep(5) if self is servers[1]
                                                                          and frozen.is_set() else None) or {})
    group = ShardGroup([ShardInfo("127.0.0.1", s.port, 0, "exec", f"s{i}") for i, s in enumerate(servers)],
                       TOKEN, chunk_bytes=4096, rpc_timeout=1.0)
    frozen.set()
    before = servers[0].last_heartbeat
    t0 = time.monotonic()
    assert group.heartbeat(0.3) == [1]  # the frozen one missed its beat ...
    assert time.monotonic() - t0 < 1.5 and servers[0].last_heartbeat > before  # ... the other got its own
    t0 = time.monotonic()
    with pytest.raises(ShardUnavailableError, match="did not answer within its deadline of 1 s"):
        group.client(1).action("ping")
    assert 0.9 < time.monotonic() - t0 < 3.0
    t0 = time.monotonic()
    with pytest.raises(ShardUnavailableError, match="is lost"):
        group.broadcast("ping")
    assert time.monotonic() - t0 < 0.5  # no second wait: lost like a killed shard


def test_settling_a_lost_job_holds_the_shards_for_the_relaunched_coordinator(shards):
    """``settle_for_relaunch`` (the client's last call before it relaunches a fit's job, whose
    coordinator beats only once its task runs) asks every shard to wait ``hold`` seconds for a
    heartbeat, whatever its lease, and claims the new epoch."""
    import time

    from pystrads.engine.executor.coordinator import settle_for_relaunch

    servers, group = shards
    t0 = time.monotonic()
    from pystrads.engine.scheduler.sealing import Seals

    assert settle_for_relaunch(group, "fit", 3, Seals.new(), hold=630.0) == "none open"
    for server in servers:
        assert t0 + 630.0 <= server.held_until <= time.monotonic() + 630.0
        assert server.fences.loop_epochs["fit"] == 3


def _peak_rss(pid: int) -> int:
    """A process's peak resident memory in bytes (VmHWM)."""
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


@pytest.mark.slow  # 300 MB through gRPC: the slow step of .ci/run
def test_large_requests_without_the_token_are_refused_unread(tmp_path):
    """Requests of 100 MB (actions, tickets, put descriptors) without the token first are refused
    naming their size, unread, and the shard keeps serving; a long request with its token first
    is served.  (gRPC receives a whole message before any handler runs: see the mutual-TLS test
    below for what keeps a peer outside the run from sending one at all.)"""
    import pyarrow as pa

    from pystrads.ps.request import MAX_UNCHECKED_BYTES

    big = b'{"token":"' + b"x" * ((100 << 20) - 20) + b'"}'
    with _shard_process(tmp_path) as (proc, port):
        uri = f"grpc://127.0.0.1:{port}"
        good = ShardClient(uri, TOKEN)
        raw = flight.FlightClient(uri)
        calls = [lambda: list(raw.do_action(flight.Action("ping", big))),
                 lambda: raw.do_get(flight.Ticket(big)).read_all(),
                 lambda: raw.do_put(flight.FlightDescriptor.for_command(big),
                                    pa.schema([pa.field("x", pa.int64())]))[0].close()]
        for call in calls:
            with pytest.raises(pa.ArrowException, match=rf"request of {len(big)} bytes .*does not start with the run"):
                call()
        assert good.action("ping")["pid"] == proc.pid  # still serving
        # a long request with the token first is read (a schedule or a program may be long)
        assert good.action("ping", padding="y" * (MAX_UNCHECKED_BYTES + 10))["pid"] == proc.pid


@pytest.mark.slow  # 200 requests of 100 MB: the slow step of .ci/run
def test_a_peer_without_the_runs_certificate_cannot_make_a_tls_shard_receive_anything(tmp_path):
    """200 requests of 100 MB each from a client that trusts the shard but holds neither the
    token nor the run's client certificate: no handshake completes, the shard keeps serving the
    run, and its peak resident memory stays under its idle peak + 2 x 100 MB."""
    import pyarrow as pa

    from pystrads.ps.server import CLIENT_CERT_ENV
    from pystrads.ps.tls import client_identity

    run_client = client_identity()
    info = {}
    with _shard_process(tmp_path, "--tls-auto", env={CLIENT_CERT_ENV: run_client[0].decode()},
                        info_out=info) as (proc, port):
        assert info["tls"] and info["mutual"]
        uri, cert = f"grpc+tls://127.0.0.1:{port}", info["cert"].encode()
        good = ShardClient(uri, TOKEN, tls_root_certs=cert, client_cert=run_client)
        assert good.action("ping")["pid"] == proc.pid
        idle = _peak_rss(proc.pid)
        raw = flight.FlightClient(uri, tls_root_certs=cert)
        big = b'{"token":"' + b"x" * ((100 << 20) - 20) + b'"}'
        calls = [lambda: list(raw.do_action(flight.Action("ping", big))),
                 lambda: raw.do_get(flight.Ticket(big)).read_all()]
        for i in range(200):
            with pytest.raises(pa.ArrowException):
                calls[i % len(calls)]()
        assert good.action("ping")["pid"] == proc.pid
        peak = _peak_rss(proc.pid)
        assert peak < idle + 2 * (100 << 20), (idle >> 20, peak >> 20)
