"""The per-instance memo of Beam's DoFn spec introspection (`sage_tfx.transform.beam_memo`): Beam's own answers,
asked once per DoFn object, and stateful DoFns still run with their state."""

import apache_beam as beam
from apache_beam.coders import VarIntCoder
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms import userstate

from sage_tfx.transform import beam_memo


class _Counting(beam.DoFn):
    COUNT = userstate.ReadModifyWriteStateSpec("count", VarIntCoder())

    def process(self, element, count=beam.DoFn.StateParam(COUNT)):  # noqa: B008 (Beam's state parameter)
        seen = (count.read() or 0) + 1
        count.write(seen)
        yield element[0], seen


class _Plain(beam.DoFn):
    def process(self, element):
        yield element


def test_the_memo_gives_beams_answer_once_per_object():
    calls = []
    beams = getattr(userstate.get_dofn_specs, "__wrapped__", userstate.get_dofn_specs)

    def original(dofn):
        calls.append(dofn)
        return beams(dofn)

    memoised = beam_memo._memoised(original)
    stateful, plain = _Counting(), _Plain()
    for dofn in (stateful, plain):
        assert memoised(dofn) == memoised(dofn) == original(dofn)
    assert [d for d in calls if d is stateful] == [stateful, stateful]  # once by the memo, once directly
    states, timers = memoised(stateful)
    assert {s.name for s in states} == {"count"} and not timers
    assert memoised(plain) == (set(), set())
    memoised(_Counting())  # another object of the same class: inspected afresh
    assert len(calls) == 5


def test_installed_once_and_stateful_dofns_keep_their_state():
    import sage_tfx.transform.beam_tables  # noqa: F401  (installs the memo)

    assert userstate.get_dofn_specs.memoised
    before = userstate.get_dofn_specs
    beam_memo.install()
    assert userstate.get_dofn_specs is before
    with beam.Pipeline() as pipeline:
        out = pipeline | beam.Create([("a", 1), ("a", 2), ("b", 3)]) | beam.ParDo(_Counting())
        assert_that(out, equal_to([("a", 1), ("a", 2), ("b", 1)]))
