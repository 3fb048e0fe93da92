"""The span processor between the turns and the collector: a bounded queue, a thread of its own, and a count of
every span that did not get out.

Why not the SDK's ``BatchSpanProcessor`` as it is: it drops spans when its queue is full, but only logs that it
did (how, and whether at all, depends on the SDK's version), and the issue asks for the drops counted. This one is
as small as the job: ``on_end`` (on the event loop, at a turn's end) appends to a deque under a lock, or counts
the span dropped when ``max_queue_size`` are already waiting; the thread sends batches of ``max_batch`` spans
every ``schedule_delay_s`` (or at once when a batch is full), and counts a batch the exporter could not deliver
(the collector refused it, or its retries ran out of ``export_timeout_s``) as dropped too. A collector that is
down or hangs holds only this thread: memory stays at the queue's bound, the turns never wait.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

log = logging.getLogger(__name__)

MAX_BATCH = 512  # spans per export request (the SDK's default); a turn is about ten


class BoundedSpanProcessor(SpanProcessor):
    def __init__(self, exporter: SpanExporter, max_queue_size: int, schedule_delay_s: float,
                 on_dropped: Callable[[int], None] | None = None, max_batch: int = MAX_BATCH) -> None:
        self.exporter = exporter
        self.max_queue_size = max(1, max_queue_size)
        self.max_batch = max(1, min(max_batch, self.max_queue_size))
        self.schedule_delay_s = schedule_delay_s
        self.on_dropped = on_dropped
        self.dropped = 0  # spans that never reached the collector (queue full, or the export failed)
        self.exported = 0
        self._queue: collections.deque[ReadableSpan] = collections.deque()
        self._cond = threading.Condition()
        self._count_lock = threading.Lock()
        self._exporting = 0  # spans taken from the queue and not yet answered for
        self._flush_asked = False
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="otel-span-export", daemon=True)
        self._thread.start()

    # --- the SDK's side (the event loop's thread) --------------------------------------------------------------
    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        return None

    def on_end(self, span: ReadableSpan) -> None:
        if span.context is None or not span.context.trace_flags.sampled:
            return
        with self._cond:
            if self._stopping or len(self._queue) >= self.max_queue_size:
                full = True
            else:
                full = False
                self._queue.append(span)
                if len(self._queue) >= self.max_batch:
                    self._cond.notify()
        if full:
            self._drop(1)

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Send what is queued now; True when all of it was answered for within the time."""
        deadline = time.monotonic() + timeout_millis / 1000
        with self._cond:
            self._flush_asked = True
            self._cond.notify_all()
            while self._queue or self._exporting:
                left = deadline - time.monotonic()
                if left <= 0 or not self._thread.is_alive():
                    return False
                self._cond.wait(left)
        return True

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Send what is queued (within ``timeout_s``), stop the thread, close the exporter; what could not be sent
        in that time is counted dropped."""
        self.force_flush(int(timeout_s * 1000))
        with self._cond:
            self._stopping = True
            left = len(self._queue)
            self._queue.clear()
            self._cond.notify_all()
        if left:
            self._drop(left)
        self._thread.join(timeout_s)
        try:
            self.exporter.shutdown()
        except Exception as exc:  # a collector gone at shutdown is not our failure
            log.debug("otel_exporter_shutdown_failed error=%r", exc)

    # --- the export thread -----------------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._stopping and not self._flush_asked and len(self._queue) < self.max_batch:
                    self._cond.wait(self.schedule_delay_s)
                if self._stopping and not self._queue:
                    return
                batch = [self._queue.popleft() for _ in range(min(self.max_batch, len(self._queue)))]
                self._exporting = len(batch)
                if not self._queue:
                    self._flush_asked = False
            if batch:
                self._export(batch)
            with self._cond:
                self._exporting = 0
                self._cond.notify_all()

    def _export(self, batch: list[ReadableSpan]) -> None:
        try:
            ok = self.exporter.export(batch) == SpanExportResult.SUCCESS
        except Exception as exc:  # the exporter should not raise; if it does, the batch is lost, not the thread
            log.warning("otel_export_failed error=%r", exc)
            ok = False
        if ok:
            self.exported += len(batch)
        else:
            self._drop(len(batch))

    def _drop(self, n: int) -> None:
        with self._count_lock:  # both threads drop: the queue's side and the exporter's
            self.dropped += n
        if self.on_dropped is not None:
            try:
                self.on_dropped(n)
            except Exception:
                log.exception("otel_drop_counter_failed")
