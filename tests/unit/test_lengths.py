"""Length histograms from a published mean and median (``spec.lengths``) and the dataset fields that ask for one."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplan import catalog
from meshplan.errors import SpecError
from meshplan.spec.lengths import _truncated_mean, lognormal_bins, lognormal_fit
from meshplan.spec.serving import Dataset, dataset_from_dict


def test_untruncated_fit_is_the_closed_form():
    """Far from its bounds a log-normal's median is e^mu and its mean e^(mu + sigma^2 / 2)."""
    mu, sigma = lognormal_fit(200, 120, 1e-6, 1e9)
    assert math.exp(mu) == pytest.approx(120, rel=1e-6)
    assert sigma == pytest.approx(math.sqrt(2 * math.log(200 / 120)), rel=1e-6)


@settings(max_examples=60, deadline=None)
@given(median=st.integers(5, 400), skew=st.floats(1.01, 4.0), hi=st.integers(500, 20000))
def test_truncated_fit_keeps_mean_and_median(median, skew, hi):
    mean = median * skew
    try:
        mu, sigma = lognormal_fit(mean, median, 4, hi)
    except SpecError as exc:  # statistics the range cannot hold are refused, not approximated
        assert "median" in str(exc) and "range" in str(exc)
        return
    assert _truncated_mean(mu, sigma, 4, hi) == pytest.approx(mean, rel=1e-4)
    bins = lognormal_bins(mean, median, 4, hi)
    lengths = [n for n, _ in bins]
    assert sum(w for _, w in bins) == pytest.approx(1.0)
    assert lengths == sorted(lengths) and 4 <= lengths[0] and lengths[-1] <= hi
    # Bins at their conditional means keep the mean (to the rounding of each bin to whole tokens)
    assert sum(n * w for n, w in bins) == pytest.approx(mean, abs=0.5 + 1e-3 * mean)
    # Equal-probability bins: the median falls between the middle two
    assert lengths[len(bins) // 2 - 1] <= median <= lengths[len(bins) // 2]


def test_sharegpt_replies_follow_the_published_median():
    """ShareGPT (sampled by the serving harnesses): mean reply 198 tokens, median 116 (sglang#1268, see the
    dataset's source), at most 2044; prompts stay at their mean (no median published)."""
    share = catalog.dataset("sharegpt")
    out = share.bins("output")
    assert len(out) == 12 and len(share.bins("input")) == 1
    assert sum(n * w for n, w in out) == pytest.approx(198, abs=1)
    assert out[5][0] < 116 < out[6][0] and out[-1][0] < 2044
    work = share.workload(rate=4.0)
    assert work.output_len == 198 and work.resident_output > 400  # length-biased: E[O^2] / E[O]


@pytest.mark.parametrize("mean, median, lo, hi", [
    (118, 116, 100, 2044), (125, 20, 4, 2044), (150, 30, 4, 2044),  # far in a tail: no 0 / 0, no overflow
])
def test_fits_deep_in_a_tail_hold_their_statistics(mean, median, lo, hi):
    mu, sigma = lognormal_fit(mean, median, lo, hi)
    assert _truncated_mean(mu, sigma, lo, hi) == pytest.approx(mean, rel=1e-4)
    bins = lognormal_bins(mean, median, lo, hi)
    assert all(lo <= n <= hi for n, _ in bins)
    assert sum(n * w for n, w in bins) == pytest.approx(mean, abs=1 + 0.01 * mean)


@pytest.mark.parametrize("mean, median, lo, hi", [
    (199, 198, 1, 199.5),  # half the mass within 1.5 tokens of the top: the mean is at most 198.75
    (198, 5, 4, 2044), (198, 4, 4, 2044), (198, 116, 115, 2044),
    (7, 5, 4, 2044),  # half the mass in [4, 5]: even the Pareto limit of the family has a mean under 6
])
def test_unreachable_statistics_are_refused(mean, median, lo, hi):
    with pytest.raises(SpecError):
        lognormal_fit(mean, median, lo, hi)


@pytest.mark.parametrize("extra, field", [
    ({"length_range": 5}, "length_range"), ({"length_range": [2044, 4]}, "length_range"),
    ({"length_range": ["a", "b"]}, "length_range"), ({"output_hist": [["a", 1]]}, "output_hist"),
    ({"output_hist": [[1, 2, 3]]}, "output_hist"), ({"output_hist": 5}, "output_hist"),
    ({"output_median": 116, "length_range": [4, 150]}, "output_mean"), ({"output_median": 1}, "output_median"),
    ({"output_median": "x"}, "output_median"), ({"output_median": 5, "length_range": [4, 2044]}, "output_median"),
])
def test_bad_dataset_tables_name_the_field(extra, field):
    base = {"name": "d", "matches": ["d"], "input_mean": 100, "output_mean": 200, "source": "s"}
    with pytest.raises(SpecError, match=field):
        dataset_from_dict({**base, **extra}, "datasets/d.toml")


def test_dataset_median_fields_are_checked():
    base = dict(name="d", matches=("d",), input_mean=100, output_mean=200, source="s")
    with pytest.raises(SpecError, match="output_median"):
        Dataset(**base, output_median=250)
    with pytest.raises(SpecError, match="length_range"):
        Dataset(**base, output_median=120, length_range=(4,))
    with pytest.raises(SpecError, match="length_range"):
        dataset_from_dict({**base, "matches": ["d"], "length_range": [10, 5]}, "datasets/d.toml")
    with pytest.raises(SpecError, match="output_median"):
        Dataset(**base, output_median=2, length_range=(4, 2044))
