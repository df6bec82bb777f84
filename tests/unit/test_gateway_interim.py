"""Interim answers (1xx) before a proxy's final answer: the parser waits for the final one, at
any cut of the bytes, and ``final_part`` drops the interim heads the crawler must not get."""

from __future__ import annotations

import pytest

from services.gateway.reading import Response, final_part

INTERIM = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a.css>\r\n\r\n"
FINAL = b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok"


@pytest.mark.parametrize("cut", range(len(INTERIM + FINAL) + 1))
def test_the_final_answer_is_the_one_parsed_at_any_cut(cut: int) -> None:
    data = INTERIM + FINAL
    response = Response(head_only=False)
    response.feed(data[:cut])
    response.feed(data[cut:])
    assert (response.status, response.interims, response.complete) == (201, 2, True)
    assert final_part(data, response.interims) == FINAL


def test_a_final_head_alone_is_not_complete_before_its_body() -> None:
    response = Response(head_only=False)
    response.feed(INTERIM + FINAL[:-2])
    assert (response.headers_done, response.complete, response.status) == (True, False, 201)


def test_final_part_of_an_answer_without_interims_is_all_of_it() -> None:
    assert final_part(FINAL, 0) == FINAL
    assert final_part(b"HTTP/1.1 100 Continue\r\n", 1) == b"HTTP/1.1 100 Continue\r\n"
