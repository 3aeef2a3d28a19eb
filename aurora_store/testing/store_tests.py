"""The object-store contract, as one suite every backend runs (as zarr's ``StoreTests``).

Subclass :class:`StoreTests` in a test module, name the subclass ``Test...`` and give it a
``store`` fixture that yields a fresh, empty :class:`~aurora_store.bucket.objectstore.ObjectStore`;
pytest then runs every contract check below against that store's backend, through the backend
interface (:mod:`aurora_store.storage`), including what its declared capabilities promise.
"""

from __future__ import annotations

import os
import threading
import time

import pytest

from aurora_store.bucket.objectstore import ObjectStore, RangeRequest
from aurora_store.errors import ConflictError, CorruptError, LimitError, MissingError, StoreError
from aurora_store.format.keys import TMP_PREFIX


class StoreTests:
    """Contract checks; a subclass provides the ``store`` fixture."""

    def test_put_if_absent_writes_once(self, store: ObjectStore) -> None:
        assert store.put_if_absent("a/b/obj", b"first")
        assert not store.put_if_absent("a/b/obj", b"second")
        assert store.get("a/b/obj", max_bytes=100) == b"first", "an object is never rewritten"
        assert store.exists("a/b/obj") and store.size("a/b/obj") == 5

    def test_racing_writers_exactly_one_wins(self, store: ObjectStore) -> None:
        barrier = threading.Barrier(8)
        won: list[bool] = [False] * 8

        def put(i: int) -> None:
            barrier.wait()
            won[i] = store.put_if_absent("race", f"writer {i}".encode())

        threads = [threading.Thread(target=put, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sum(won) == 1
        assert store.get("race", max_bytes=100) == f"writer {won.index(True)}".encode()

    def test_put_immutable_tolerates_a_retry_and_refuses_other_bytes(self, store: ObjectStore) -> None:
        assert store.put_immutable("k", b"abc", verify=lambda b: b == b"abc")
        assert not store.put_immutable("k", b"abc", verify=lambda b: b == b"abc")
        with pytest.raises(ConflictError, match="immutable") as err:
            store.put_immutable("k", b"abd", verify=lambda b: b == b"abd")
        assert err.value.url == store.url("k")
        assert store.get("k", max_bytes=10) == b"abc"

    def test_empty_objects(self, store: ObjectStore) -> None:
        assert store.put_if_absent("empty", b"")
        assert store.get("empty", max_bytes=0) == b"" and store.size("empty") == 0
        assert store.get_sized("empty", 0, 4) == b""

    def test_get_is_capped_before_it_reads_everything(self, store: ObjectStore) -> None:
        store.put_if_absent("big", b"x" * 1000)
        assert store.get("big", max_bytes=1000) == b"x" * 1000
        with pytest.raises(LimitError, match="larger than the cap of 999") as err:
            store.get("big", max_bytes=999)
        assert err.value.url == store.url("big")

    def test_ranged_reads(self, store: ObjectStore) -> None:
        data = bytes(range(256)) * 4
        store.put_if_absent("r", data)
        assert store.get_range(RangeRequest("r", 0, 10)) == data[:10]
        assert store.get_range(RangeRequest("r", 1000, 1024)) == data[1000:]
        assert store.get_range(RangeRequest("r", 1020, 2000)) == data[1020:], "a range past the end is cut"
        assert store.get_range(RangeRequest("r", 1024, 2000)) == b"", "a range at the end is empty"
        assert store.get_range(RangeRequest("r", 5000, 6000)) == b""

    def test_sized_reads_in_parallel_parts(self, store: ObjectStore) -> None:
        data = bytes(range(256)) * 40
        store.put_if_absent("s", data)
        for part in (100, len(data), len(data) + 1):
            assert store.get_sized("s", len(data), part) == data
        small = data[:300]  # each part is a request: 1- and 7-byte parts of 10 KiB took 80 s on an S3 server
        store.put_if_absent("s1", small)
        for part in (1, 7):
            assert store.get_sized("s1", len(small), part) == small
        with pytest.raises(CorruptError, match="truncated") as err:
            store.get_sized("s", len(data) + 1, 100)
        assert err.value.url == store.url("s")
        with pytest.raises(CorruptError, match="longer than recorded"):
            store.get_sized("s", len(data) - 1, 100)

    def test_missing_objects(self, store: ObjectStore) -> None:
        assert not store.exists("nope")
        for read in (
            lambda: store.get("nope", max_bytes=10),
            lambda: store.size("nope"),
            lambda: store.get_range(RangeRequest("nope", 0, 1)),
            lambda: store.get_sized("nope", 3, 2),
        ):
            with pytest.raises(MissingError) as err:
                read()
            assert isinstance(err.value, FileNotFoundError) and isinstance(err.value, StoreError)
            assert err.value.url == store.url("nope")

    def test_listing_is_recursive_sorted_and_relative(self, store: ObjectStore) -> None:
        assert store.list_keys("versions") == []
        for key in ("versions/0000000001/b.seg", "versions/0000000000/manifest.json", "versions/x", "files/cfg"):
            store.put_if_absent(key, b"1")
        assert store.list_keys("versions") == [
            "versions/0000000000/manifest.json",
            "versions/0000000001/b.seg",
            "versions/x",
        ]
        assert store.list_keys("files") == ["files/cfg"]
        assert store.list_keys("versions/0000000001") == ["versions/0000000001/b.seg"]
        assert store.list_keys("nothing/here") == []

    def test_temporary_names_are_never_listed(self, store: ObjectStore) -> None:
        store.put_if_absent(f"files/{TMP_PREFIX}half-written", b"1")
        store.put_if_absent("files/real", b"1")
        assert store.list_keys("files") == ["files/real"]

    def test_staged_writes_become_objects_only_when_linked(self, store: ObjectStore) -> None:
        d = "versions/0000000001"
        staged = store.stage(d)
        if staged is None:
            assert not store.capabilities.staged_write, "a backend that stages writes shards while they are hashed"
            return
        for piece in (b"abc", memoryview(b"defg"), b""):
            staged.write(piece)
        assert store.list_keys(d) == [], "nothing is an object before it is linked"
        assert staged.link(f"{d}/00000-x.safetensors")
        assert store.get_sized(f"{d}/00000-x.safetensors", 7, 3) == b"abcdefg"
        again = store.stage(d)
        assert again is not None
        again.write(b"other")
        assert not again.link(f"{d}/00000-x.safetensors"), "an object is never replaced"
        assert store.get(f"{d}/00000-x.safetensors", max_bytes=10) == b"abcdefg"
        dropped, astray = store.stage(d), store.stage(d)
        assert dropped is not None and astray is not None
        dropped.write(b"half")
        dropped.discard()
        astray.write(b"elsewhere")
        with pytest.raises(StoreError, match="cannot become"):
            astray.link("versions/0000000002/00000-y.safetensors")
        with pytest.raises(StoreError, match="after it was linked or discarded"):
            dropped.write(b"late")
        assert store.list_keys("versions") == [f"{d}/00000-x.safetensors"]
        assert sorted(os.listdir(store.path(d))) == ["00000-x.safetensors"], "no temporary file is left"

    def test_a_killed_writers_temporary_is_swept_and_a_live_ones_kept(self, store: ObjectStore) -> None:
        staged = store.stage("versions/0000000001")
        if staged is None:
            assert store.sweep_temporaries(idle_s=0) == 0, "whole-object puts leave nothing to sweep"
            return
        staged.write(b"half")  # its writer is killed here
        assert store.sweep_temporaries(idle_s=3600) == 0, "written to within the hour: a live writer's"
        assert store.sweep_temporaries(idle_s=-1) == 1
        with pytest.raises(MissingError):  # never a silent success: its bytes are gone
            staged.link("versions/0000000001/x")
        assert store.list_keys("versions") == []

    def test_every_backend_creates_atomically(self, store: ObjectStore) -> None:
        assert store.capabilities.atomic_create, "a store is never opened on a backend that cannot"

    def test_listing_reports_when_objects_were_written(self, store: ObjectStore) -> None:
        before = time.time()
        store.put_if_absent("results/a.bin", b"12345")
        store.put_if_absent(f"results/{TMP_PREFIX}x", b"1")
        listed = store.list_modified("results")
        assert [(key, size) for key, size, _ in listed] == [("results/a.bin", 5)]
        assert store.list_modified("nothing/here") == []
        (_, _, modified), slack = listed[0], 120  # clocks of a remote store's servers drift a little
        if store.capabilities.mtime:
            assert modified is not None and before - slack <= modified <= time.time() + slack
        else:
            assert modified is None

    def test_map_keeps_order(self, store: ObjectStore) -> None:
        keys = [f"m/{i:03d}" for i in range(40)]
        list(store.map(lambda k: store.put_if_absent(k, k.encode()), keys))
        assert list(store.map(lambda k: store.get(k, max_bytes=10), keys)) == [k.encode() for k in keys]

    def test_urls_name_the_object(self, store: ObjectStore) -> None:
        assert store.url("a/b") == f"{store.uri}/a/b"
        assert not store.uri.endswith("/")
