"""The checks of a batch input file, with spellings nobody planned for."""

from __future__ import annotations

import json

import pytest

from appliance.batch.lines import MAX_REPORTED_ERRORS, check_file
from appliance.errors import BadRequest


def _line(custom_id: str = "a", **changes: object) -> bytes:
    item = {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/embeddings",
        "body": {"model": "m", "input": "text"},
    }
    item.update(changes)
    return json.dumps(item, ensure_ascii=False).encode()


def test_crlf_bom_blank_lines_and_unicode_ids_are_read():
    content = b"\xef\xbb\xbf" + _line("\u00e9t\u00e9 \U0001f600") + b"\r\n\r\n  \n" + _line("b") + b"\r\n"
    checked = check_file(content, 10)
    assert [(line.index, line.custom_id) for line in checked.lines] == [(0, "\u00e9t\u00e9 \U0001f600"), (3, "b")]
    assert checked.endpoints == frozenset({"/v1/embeddings"})


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        (b"\xff\xfe{}", "not valid JSON"),
        (b"null", "must be a JSON object"),
        (_line("x" * 513), "custom_id"),
        (_line(custom_id=7), "custom_id"),  # type: ignore[arg-type]
        (_line(method="post"), "`method`"),
        (_line(url="/v1/embeddings/"), "`url`"),
        (_line(url="/V1/EMBEDDINGS"), "`url`"),
        (_line(url="/v1/chat/completions%00"), "`url`"),
        (_line(body={"model": ""}), "`body.model`"),
        (_line(body={"model": ["m"]}), "`body.model`"),
        (_line(body=[]), "`body` must be"),
        (_line(body={"model": "m", "input": {"not": "text"}}), "not a valid /v1/embeddings request"),
    ],
)
def test_a_bad_line_is_named_by_number(line, problem):
    with pytest.raises(BadRequest) as raised:
        check_file(_line("first") + b"\n" + line + b"\n", 10)
    assert "line 2" in raised.value.message and problem in raised.value.message, raised.value.message
    assert raised.value.code == "invalid_batch_line"


def test_many_bad_lines_are_reported_up_to_a_bound():
    content = b"\n".join(b"{" for _ in range(5000))
    with pytest.raises(BadRequest) as raised:
        check_file(content, 100_000)
    assert raised.value.message.count("not valid JSON") == MAX_REPORTED_ERRORS
    assert "line 1:" in raised.value.message and f"line {MAX_REPORTED_ERRORS}:" in raised.value.message


def test_line_count_and_empty_files_are_refused():
    with pytest.raises(BadRequest, match="batch_max_lines"):
        check_file(b"\n".join(_line(str(i)) for i in range(4)), 3)
    with pytest.raises(BadRequest, match="no request lines"):
        check_file(b"\n \r\n\n", 3)
    with pytest.raises(BadRequest, match="repeats line 1"):
        check_file(_line("same") + b"\n" + _line("same"), 3)
