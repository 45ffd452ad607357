"""The image table's resolution rules (no cluster needed)."""

from __future__ import annotations

import pytest

from clef_devcluster.images import (
    ImageEntry,
    ImageTable,
    default_digest,
    fault_image,
    fault_names,
    seed_table,
    split_ref,
)


def test_split_ref_keeps_a_registry_port_out_of_the_tag() -> None:
    assert split_ref("localhost:5000/clef-runtime") == ("localhost:5000/clef-runtime", None, None)
    assert split_ref("localhost:5000/clef-runtime:1.0") == ("localhost:5000/clef-runtime", "1.0", None)
    d = "a" * 64
    assert split_ref(f"r.test/x:1.0@sha256:{d}") == ("r.test/x", "1.0", d)
    with pytest.raises(ValueError):
        split_ref("r.test/x@md5:abc")


def test_a_moved_tag_resolves_to_its_newest_entry_and_old_digests_still_resolve() -> None:
    ref = "r.test/clef-runtime:1.0"
    old = ImageEntry(ref, "good", default_digest(ref))
    new = ImageEntry(ref, "fault", default_digest(ref, 1), fault="beta_no_sigmoid")
    table = ImageTable((old, new))
    assert table.lookup(ref) == new
    assert table.lookup(f"r.test/clef-runtime@sha256:{old.digest}") == old
    assert table.lookup(f"r.test/clef-runtime:1.0@sha256:{old.digest}") == old
    assert table.lookup(f"r.test/other@sha256:{old.digest}") is None
    assert table.lookup("r.test/clef-runtime:2.0") is None
    assert ImageTable.parse(table.dump()) == table


def test_untagged_means_latest() -> None:
    e = ImageEntry("r.test/x:latest", "good", default_digest("r.test/x:latest"))
    assert ImageTable((e,)).lookup("r.test/x") == e


def test_entries_are_checked() -> None:
    with pytest.raises(ValueError, match="kind"):
        ImageEntry("r.test/x:1", "flaky", default_digest("x"))
    with pytest.raises(ValueError, match="fault"):
        ImageEntry("r.test/x:1", "fault", default_digest("x"))
    with pytest.raises(ValueError, match="digest"):
        ImageEntry("r.test/x:1", "good", "abc")


def test_the_seed_covers_the_whole_fault_catalogue_and_the_other_kinds() -> None:
    table = seed_table()
    kinds = {e.kind for e in table.entries}
    assert kinds == {"good", "fault", "hang", "unpullable", "serve"}
    for fault in fault_names():
        entry = table.lookup(fault_image(fault))
        assert entry is not None and (entry.kind, entry.fault) == ("fault", fault)
    digests = [e.digest for e in table.entries]
    assert len(set(digests)) == len(digests)
