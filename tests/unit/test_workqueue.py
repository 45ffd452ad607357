"""workqueue: the pure bookkeeping with an injected clock, then the threads' view of it."""

from __future__ import annotations

import threading
import time

import pytest

from clef_operator.manager.workqueue import MAX_BACKOFF_SECONDS, SharedQueue, WorkQueue

A, B, C = ("ns", "a"), ("ns", "b"), ("other", "a")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def queue() -> tuple[WorkQueue, Clock]:
    clock = Clock()
    return WorkQueue(clock), clock


def drain(q: WorkQueue) -> list[tuple[str, str]]:
    """Every key ready now, each marked done at once."""
    out = []
    while (key := q.get()) is not None:
        out.append(key)
        q.done(key)
    return out


def test_keys_are_handed_out_in_order_and_deduplicated() -> None:
    q, _ = queue()
    for key in (A, B, A, C, B):
        q.add(key)
    assert q.depth() == 3 and q.known() == 3
    assert drain(q) == [A, B, C]
    assert q.get() is None and q.known() == 0 and q.wait_seconds() is None


def test_a_key_being_processed_is_never_handed_out_twice() -> None:
    q, _ = queue()
    q.add(A)
    assert q.get() == A
    q.add(A)  # an event during the pass
    q.add(A)
    assert q.get() is None, "A is processing: not handed out again before done"
    assert q.depth() == 0 and q.known() == 1
    q.done(A)
    assert q.get() == A, "added while processing: handed out again after done"
    q.done(A)
    assert q.get() is None


def test_done_without_a_new_add_leaves_nothing() -> None:
    q, _ = queue()
    q.add(A)
    q.done(q.get())  # type: ignore[arg-type]
    assert q.known() == 0 and q.get() is None


def test_add_after_waits_for_the_clock() -> None:
    q, clock = queue()
    q.add_after(A, 5)
    assert q.get() is None and q.known() == 1
    assert q.wait_seconds() == 5
    clock.now += 4.9
    assert q.get() is None and q.wait_seconds() == pytest.approx(0.1)
    clock.now += 0.1
    assert q.wait_seconds() == 0
    assert q.get() == A
    q.done(A)
    assert q.known() == 0 and q.wait_seconds() is None


def test_the_earliest_deadline_wins() -> None:
    q, clock = queue()
    q.add_after(A, 300)
    q.add_after(A, 5)  # sooner: replaces
    q.add_after(A, 60)  # later: ignored
    clock.now += 5
    assert drain(q) == [A]
    clock.now += 1000  # neither the 60 s nor the 300 s deadline is still held
    assert drain(q) == [] and q.known() == 0


def test_deadlines_come_in_time_order_across_keys() -> None:
    q, clock = queue()
    q.add_after(A, 3)
    q.add_after(B, 1)
    q.add_after(C, 2)
    clock.now += 10
    assert drain(q) == [B, C, A]


def test_add_after_of_zero_or_less_is_an_add() -> None:
    q, _ = queue()
    q.add_after(A, 0)
    q.add_after(B, -1)
    assert drain(q) == [A, B]


def test_a_due_key_that_is_already_queued_is_not_queued_twice() -> None:
    q, clock = queue()
    q.add_after(A, 1)
    q.add(A)
    clock.now += 1
    assert drain(q) == [A]


def test_a_deadline_reached_while_processing_hands_the_key_out_after_done() -> None:
    q, clock = queue()
    q.add(A)
    assert q.get() == A
    q.add_after(A, 1)
    clock.now += 1
    assert q.get() is None
    q.done(A)
    assert q.get() == A


def test_backoff_doubles_from_one_second_to_the_cap_and_resets_on_success() -> None:
    q, clock = queue()
    delays = []
    for _ in range(9):
        q.add(A)
        assert q.get() == A
        delays.append(q.retry(A))
        q.done(A)
        clock.now += delays[-1]
    assert delays == [1, 2, 4, 8, 16, 32, MAX_BACKOFF_SECONDS, MAX_BACKOFF_SECONDS, MAX_BACKOFF_SECONDS]
    q.succeeded(A)
    assert q.retry(A) == 1


def test_a_retry_is_scheduled_after_its_backoff() -> None:
    q, clock = queue()
    q.add(A)
    assert q.get() == A
    assert q.retry(A) == 1
    q.done(A)
    assert q.get() is None
    clock.now += 1
    assert q.get() == A


def test_backoff_is_per_key_and_kept_only_while_failing() -> None:
    q, _ = queue()
    q.retry(A)
    q.retry(A)
    assert q.retry(B) == 1
    q.succeeded(A)
    q.forget(B)
    assert q.retry(A) == 1 and q.retry(B) == 1


def test_many_retries_do_not_overflow() -> None:
    q, _ = queue()
    for _ in range(2000):
        assert q.retry(A) <= MAX_BACKOFF_SECONDS


def test_forget_drops_everything_about_a_key() -> None:
    q, clock = queue()
    q.add(A)
    q.add(B)
    q.add_after(A, 5)
    q.retry(A)
    q.forget(A)
    assert q.known() == 1
    clock.now += 100
    assert drain(q) == [B]
    assert q.known() == 0 and q.wait_seconds() is None
    assert q.retry(A) == 1, "its backoff started over"


@pytest.mark.parametrize("readded", [False, True])
def test_forget_during_a_pass_keeps_the_pass_and_drops_what_came_before_it(readded: bool) -> None:
    """Added, forgotten (the model deleted) and maybe added again (created again under its name)
    while a pass over it runs: after `done`, handed out only if added after the forget."""
    q, _ = queue()
    q.add(A)
    assert q.get() == A
    q.add(A)
    q.forget(A)
    assert q.known() == 1, "the running pass is still known until done"
    if readded:
        q.add(A)
    q.done(A)
    assert q.get() == (A if readded else None)


def test_the_heap_stays_the_size_of_the_keys() -> None:
    q, clock = queue()
    for i in range(1000):
        q.add_after(A, 1000 - i)  # each sooner than the last: a new entry every time
    assert len(q._heap) <= 2 * len(q._due) + 64
    keys = [("ns", str(i)) for i in range(500)]
    for key in keys:
        q.add_after(key, 10)
    for key in keys:
        q.forget(key)
    assert len(q._heap) <= 2 * len(q._due) + 64
    clock.now += 1
    assert drain(q) == [A]


# ------------------------------------------------------------------------------- threads


def until_waiting(shared: SharedQueue, n: int) -> None:
    """Until `n` threads are blocked in `get` (the state the test is about), within 10 s."""
    deadline = time.monotonic() + 10
    while shared.waiting() < n:
        assert time.monotonic() < deadline, f"{shared.waiting()} of {n} workers reached get()"
        # A thread entering Condition.wait signals nothing to others: read the count every 1 ms.
        time.sleep(0.001)


def test_a_waiting_worker_gets_a_key_added_from_another_thread() -> None:
    shared = SharedQueue()
    got: list[tuple[str, str] | None] = []
    worker = threading.Thread(target=lambda: got.append(shared.get()))
    worker.start()
    until_waiting(shared, 1)
    shared.add(A)
    worker.join(5)
    assert got == [A]


def test_a_waiting_worker_wakes_for_a_deadline_sooner_than_the_one_it_waits_for() -> None:
    shared = SharedQueue()
    shared.add_after(B, 60)
    got: list[tuple[str, str] | None] = []
    worker = threading.Thread(target=lambda: got.append(shared.get()))
    worker.start()
    until_waiting(shared, 1)
    started = time.monotonic()
    shared.add_after(A, 0.1)
    worker.join(10)
    assert got == [A] and time.monotonic() - started < 10


def test_close_ends_every_waiting_get() -> None:
    shared = SharedQueue()
    got: list[tuple[str, str] | None] = []
    workers = [threading.Thread(target=lambda: got.append(shared.get())) for _ in range(3)]
    for w in workers:
        w.start()
    until_waiting(shared, 3)
    shared.close()
    for w in workers:
        w.join(5)
    assert got == [None, None, None]
    shared.add(A)
    assert shared.get() is None, "closed for good"


def test_threads_never_process_one_key_at_once() -> None:
    shared = SharedQueue()
    running: set[tuple[str, str]] = set()
    overlaps: list[tuple[str, str]] = []
    lock = threading.Lock()

    def work() -> None:
        while (key := shared.get()) is not None:
            with lock:
                if key in running:
                    overlaps.append(key)
                running.add(key)
            time.sleep(0.001)
            with lock:
                running.discard(key)
            shared.done(key)

    workers = [threading.Thread(target=work) for _ in range(4)]
    for w in workers:
        w.start()
    for i in range(300):
        shared.add((A, B, C)[i % 3])
        if i % 7 == 0:
            time.sleep(0.001)
    deadline = time.monotonic() + 10
    while (shared.known() or running) and time.monotonic() < deadline:
        time.sleep(0.01)
    shared.close()
    for w in workers:
        w.join(5)
    assert overlaps == [] and shared.known() == 0
