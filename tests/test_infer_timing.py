"""`infer_timing.side_by_side` interleaves the decoders batch by batch and keeps each batch's
fastest call (a scripted clock stands in for the machine), and stops when asked."""

from spec_decode.infer import timing as infer_timing


def test_interleaved_rounds_keep_each_batchs_fastest_call(monkeypatch):
  # Seconds each call takes, in the order the calls are made: 2 rounds x 2 batches x (a, b).
  durations = iter([5.0, 7.0, 1.0, 2.0,    # round 1: a0 b0 a1 b1
                    3.0, 9.0, 4.0, 1.5])   # round 2
  order, clock = [], [0.0]

  def perf_counter():
    return clock[0]

  def call(name):
    def compiled(batch):
      order.append((name, batch))
      clock[0] += next(durations)  # the call's time passes while it runs
    return compiled

  monkeypatch.setattr(infer_timing.time, "perf_counter", perf_counter)
  seconds = infer_timing.side_by_side(
      {"a": (call("a"), lambda i: (i,)), "b": (call("b"), lambda i: (i,))}, 2, rounds=2)
  assert order == [("a", 0), ("b", 0), ("a", 1), ("b", 1)] * 2
  assert seconds == {"a": 3.0 + 1.0, "b": 7.0 + 1.5}


def test_a_stop_request_ends_the_timing_after_the_batch_in_flight():
  order = []
  call = lambda name: (lambda batch: order.append((name, batch)), lambda i: (i,))
  seconds = infer_timing.side_by_side({"a": call("a"), "b": call("b")}, 3, rounds=2,
                                      stopped=lambda: len(order) >= 2)
  assert seconds is None and order == [("a", 0), ("b", 0)]
