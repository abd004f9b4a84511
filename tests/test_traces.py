import pytest

from loom.errors import LoomInputError
from loom.workload.loaders import load_trace

HEADER = "#job id,arrival time (sec),topology,shape,size,duration (sec)\n"


@pytest.mark.parametrize(
    "row, field, message",
    [
        ("1,abc,CLOS,1,1,5\n", "arrival time (sec)", "not a number"),
        ("1,-3,CLOS,1,1,5\n", "arrival time (sec)", "negative arrival"),
        ("1,3,CLOS,1,0,5\n", "size", "≥ 1"),
        ("1,3,CLOS,1,1,-5\n", "duration (sec)", "negative duration"),
        ("0,3,CLOS,1,1,5\n", "#job id", "duplicate"),
    ],
)
def test_rfold_bad_rows_are_located(tmp_path, row, field, message):
    path = tmp_path / "t.csv"
    path.write_text(HEADER + "0,0,CLOS,1,1,5\n" + row)
    with pytest.raises(LoomInputError) as err:
        load_trace(f"rfold:{path}")
    text = str(err.value)
    assert str(path) in text and "line 3" in text and field in text and message in text


def test_rfold_missing_columns(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("id,time\n1,2\n")
    with pytest.raises(LoomInputError, match="missing columns"):
        load_trace(f"rfold:{path}")


def test_rfold_sorted_by_arrival(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text(HEADER + "a,10,CLOS,1,1,5\nb,0,CLOS,2,2,0\n")
    jobs = load_trace(f"rfold:{path}")
    assert [j.job_id for j in jobs] == ["b", "a"] and jobs[0].gpus == 2 and jobs[0].duration == 0


def test_philly_trace_is_complete():
    jobs = load_trace("philly")
    assert len(jobs) == 111_549
    assert max(j.gpus for j in jobs) == 128
    assert sum(1 for j in jobs if j.duration == 0) == 10
