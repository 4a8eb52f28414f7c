"""The search space from a measured curve, and the reading of trials: what caps the batch size and the queue
delay, which candidates are screened, which trial wins and which are on the Pareto front."""

from __future__ import annotations

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from services.gateway.tuning.candidates import Candidate, applied, current, unbatched, untunable
from services.gateway.tuning.options import TuneOptions, TuneOptionsError
from services.gateway.tuning.results import Measurement, Trial, best_p99_ms, contenders, pareto_front, winner
from services.gateway.tuning.service import _no_winner
from services.gateway.tuning.space import Curve, derive, screen

# A model whose batches of 32 take 12 ms and of 1 take 1 ms: rows per second grow until 16.
CURVE = Curve({1: 1.0, 2: 1.1, 4: 1.3, 8: 2.0, 16: 3.0, 32: 12.0})


def measured(number: int, p99s: dict[int, float], throughput: float, *, round_: int = 1) -> Trial:
    measurements = tuple(
        Measurement(level, int(throughput), 0, 1.0, p99 / 2, p99, 0.1) for level, p99 in sorted(p99s.items())
    )
    return Trial(number, round_, Candidate(number, 0, (), 8), False, measurements)


def test_space_caps_batch_size_when_one_batch_takes_over_a_third_of_slo() -> None:
    space = derive(CURVE, 30.0, max_instances=2)
    assert max(space.max_batch_sizes) == 16  # 32 rows take 12 ms > 30 / 3
    assert derive(CURVE, 40.0, max_instances=2).max_batch_sizes[-1] == 32


def test_space_bounds_queue_delay_by_slo_when_derived() -> None:
    space = derive(CURVE, 30.0, max_instances=2)
    # (30 ms - two batches of 16 at 3 ms) / 2 = 12 ms at most; 0 always tried.
    assert space.delays_us[0] == 0
    assert max(space.delays_us) == 12_000
    assert max(derive(CURVE, 5000.0, max_instances=1).delays_us) == 20_000  # never past the hard bound


def test_space_prefers_batch_at_knee_when_curve_flattens() -> None:
    space = derive(CURVE, 30.0, max_instances=3)
    assert space.instances == (1, 2, 3)
    # 16 rows in 3 ms is the best rate (5.3 rows/ms); 8 rows in 2 ms (4) is 75 % of it, 16 the knee.
    assert space.preferred == ((), (16,))


def test_screen_covers_every_instance_count_and_delay_when_count_allows() -> None:
    space = derive(CURVE, 30.0, max_instances=2)
    chosen = screen(space, 6)
    assert len(chosen) == len(set(chosen)) == 6
    assert {c.instances for c in chosen} == {1, 2}
    assert {c.max_queue_delay_us for c in chosen} == set(space.delays_us)
    assert screen(space, 6) == chosen  # seeded: the same run screens the same candidates


def test_candidate_round_trips_through_config_when_applied() -> None:
    config = mc.ModelConfig(name="m", max_batch_size=32)
    config.instance_group.add(count=2, kind=mc.ModelInstanceGroup.KIND_CPU)
    config.dynamic_batching.max_queue_delay_microseconds = 2000
    candidate = Candidate(3, 150, (4, 8), 16)
    tuned = applied(config, candidate, name="trial")
    assert current(tuned) == candidate
    assert tuned.name == "trial"
    assert tuned.instance_group[0].kind == mc.ModelInstanceGroup.KIND_CPU
    assert current(config) == Candidate(2, 2000, (), 32)  # the original is untouched
    probe = unbatched(config, name="probe")
    assert not probe.HasField("dynamic_batching")
    assert probe.instance_group[0].count == 1


def test_winner_is_fastest_trial_meeting_slo_at_every_level_when_several_do() -> None:
    trials = [
        measured(1, {1: 5, 8: 9}, 900),
        measured(2, {1: 5, 8: 11}, 2000),  # fastest, but breaks the SLO at 8 clients
        measured(3, {1: 4, 8: 8}, 1000),
        measured(4, {8: 1}, 5000, round_=0),  # screened at the top level only: cannot win
    ]
    found = winner(trials, 10.0, [1, 8])
    assert found is not None
    assert found.number == 3
    assert winner(trials, 3.0, [1, 8]) is None
    assert best_p99_ms(trials) == 8  # among the fully measured trials


def test_pareto_front_keeps_trials_nothing_beats_on_both_when_compared() -> None:
    trials = [measured(1, {8: 9}, 900), measured(2, {8: 11}, 2000), measured(3, {8: 8}, 1000)]
    trials.append(measured(4, {8: 12}, 1500))  # slower than 2 and later than 3: dominated
    assert [t.number for t in pareto_front(trials)] == [3, 2]


@pytest.mark.parametrize(
    "fields",
    [{"p99_ms": 0}, {"p99_ms": 10, "concurrency": []}, {"p99_ms": 10, "duration_s": 0.01}, {"p99_ms": True}],
)
def test_options_refuse_when_out_of_range(fields: dict[str, object]) -> None:
    with pytest.raises(TuneOptionsError):
        TuneOptions.from_json(fields)


def test_candidate_parses_back_when_label_comes_from_table() -> None:
    for candidate in (Candidate(2, 500, (8, 16), 32), Candidate(1, 0, (), 4)):
        assert Candidate.parse(candidate.label) == candidate
    with pytest.raises(ValueError, match="not a candidate"):
        Candidate.parse("two instances please")
    assert TuneOptions.from_json({"p99_ms": 5, "candidates": ["i1 d0us p[-] b8"]}).candidates == (
        Candidate(1, 0, (), 8),
    )


def test_winner_averages_runs_and_needs_every_run_to_meet_slo_when_confirmed() -> None:
    first, second = measured(1, {1: 5, 8: 9}, 1000), measured(2, {1: 5, 8: 9}, 1200)
    confirmed_first = Trial(3, 2, first.candidate, False, (Measurement(8, 2000, 0, 1.0, 4, 9, 0.1),))
    failed_second = Trial(4, 2, second.candidate, False, (Measurement(8, 1300, 0, 1.0, 4, 15, 0.1),))
    found = winner([first, second, confirmed_first, failed_second], 10.0, [1, 8])
    assert found is not None
    assert found.number == 1  # (1000 + 2000) / 2 beats 1200; and 2 broke the SLO when confirmed
    assert winner([first, second, confirmed_first], 10.0, [1, 8]) == first
    assert winner([first, second], 10.0, [1, 8]) == second


def test_winner_is_a_confirmed_finalist_when_a_candidate_measured_once_scores_higher() -> None:
    # A real run's figures: the finalists' confirmations came out lower (a shared CPU), and the third candidate's
    # one run at 4 clients beat their averages; at 1 client it was three times slower than both.
    fast, current_, third = measured(1, {1: 0.23, 4: 0.29}, 29436), measured(2, {1: 0.33, 4: 0.32}, 29405), measured(
        3, {1: 2.93, 4: 0.29}, 29136
    )
    confirmations = [
        Trial(4, 2, current_.candidate, False, (Measurement(4, 23470, 0, 1.0, 0.5, 1.28, 0.1),)),
        Trial(5, 2, fast.candidate, False, (Measurement(4, 20081, 0, 1.0, 0.5, 3.0, 0.1),)),
    ]
    trials = [fast, current_, third, *confirmations]
    assert contenders(trials) == [current_.candidate, fast.candidate]
    assert winner(trials, 100.0, [1, 4]) == current_  # (29405 + 23470) / 2 beats (29436 + 20081) / 2
    assert winner([fast, current_, third], 100.0, [1, 4]) == fast  # before any confirmation, every full run competes
    # A confirmation may knock a finalist out, but never crowns a candidate measured once: with both finalists out
    # (1.28 and 3 ms over a 1 ms SLO) there is no winner, though a third setting met 1 ms in its one run.
    steady = measured(6, {1: 0.5, 4: 0.6}, 25000)
    assert winner([*trials, steady], 2.0, [1, 4]) == current_
    assert winner([*trials, steady], 1.0, [1, 4]) is None


def test_winner_breaks_a_throughput_tie_by_worst_p99_over_every_run_when_finalists_tie() -> None:
    first, second = measured(1, {1: 2, 8: 3}, 1000), measured(2, {1: 4, 8: 5}, 1000)
    trials = [
        first, second,
        Trial(3, 2, first.candidate, False, (Measurement(8, 1000, 0, 1.0, 4, 9, 0.1),)),  # its worst run: 9 ms
        Trial(4, 2, second.candidate, False, (Measurement(8, 1000, 0, 1.0, 4, 6, 0.1),)),
    ]
    assert winner(trials, 10.0, [1, 8]) == second  # 6 ms at worst beats 9, though first's first run was quicker


def test_applied_keeps_instance_group_fields_when_candidate_sets_its_count() -> None:
    config = mc.ModelConfig(name="m", max_batch_size=32)
    group = config.instance_group.add(name="m_gpu", count=2, kind=mc.ModelInstanceGroup.KIND_GPU, gpus=[1])
    group.rate_limiter.priority = 3
    group.rate_limiter.resources.add(name="R1", count=4)
    group.host_policy = "numa0"
    tuned = applied(config, Candidate(3, 150, (), 16))
    expected = mc.ModelInstanceGroup()
    expected.CopyFrom(group)
    expected.count = 3
    assert list(tuned.instance_group) == [expected]  # published as is: what the old group said stays said
    assert unbatched(config, name="probe").instance_group[0].gpus == [1]


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        ("sequence_batching { max_sequence_idle_microseconds: 5000000 }", "sequence_batching"),
        ("ensemble_scheduling { step { model_name: 'a' model_version: -1 } }", "ensemble_scheduling"),
        ("model_transaction_policy { decoupled: true } dynamic_batching {}", "decoupled"),
        ("instance_group { count: 1 } instance_group { count: 2 }", "2 instance_group entries"),
        ("", "does not batch"),
    ],
)
def test_applied_refuses_naming_why_when_config_cannot_be_tuned(edit: str, named: str) -> None:
    config = mc.ModelConfig(name="m", max_batch_size=0 if not edit else 8)
    text_format.Parse(edit, config)
    assert named in (untunable(config) or "")
    with pytest.raises(ValueError, match=named):  # never a config that silently dropped the model's scheduler
        applied(config, Candidate(1, 0, (), 8))


@pytest.mark.parametrize(
    ("label", "needs"),
    [
        ("i0 d0us p[-] b8", "at least 1 instance (i1)"),
        ("i1 d0us p[0] b8", "preferred batch sizes from 1 to the max batch size, 8"),
        ("i1 d0us p[16] b8", "preferred batch sizes from 1 to the max batch size, 8"),
        ("i1 d0us p[-] b0", "a max batch size of at least 1 (b1)"),
    ],
)
def test_options_refuse_naming_label_and_what_it_needs_when_candidate_is_out_of_range(label: str, needs: str) -> None:
    with pytest.raises(TuneOptionsError) as refused:
        TuneOptions.from_json({"p99_ms": 10, "candidates": [label]})
    assert str(refused.value) == f"not a valid candidate: '{label}' needs {needs}"


def test_no_winner_error_says_nothing_was_answered_when_a_level_measured_no_request() -> None:
    answered = Measurement(1, 300, 0, 0.3, 1.0, 2.0, 0.1)
    silent = Measurement(4, 0, 0, 0.35, float("inf"), float("inf"), 0.0)  # first answers after the measured time
    trials = [Trial(1, 1, Candidate(1, 500, (4,), 16), False, (answered, silent))]
    options = TuneOptions(p99_ms=100, concurrency=(1, 4), candidates=(Candidate(1, 500, (4,), 16),))
    assert winner(trials, 100, [1, 4]) is None
    assert _no_winner(trials, options) == (
        "no setting met p99 <= 100 ms at every concurrency (1, 4); the closest setting (i1 d500us p[4] b16, "
        "trial 1) answered no request within the measured time at 4 clients: give it a longer --duration"
    )
