"""The search page's shared-link parameters over HTTP: ``/?q=...&lang=...`` fills the form in (escaped) and
marks it to run on load; without q nothing runs. The browser side is in test_pages_browser.py."""

from __future__ import annotations

from html.parser import HTMLParser

import httpx


class FormFields(HTMLParser):
    """The attributes of the search form, its query box and the selected option of its language list."""

    def __init__(self) -> None:
        super().__init__()
        self.form: dict[str, str | None] = {}
        self.query: dict[str, str | None] = {}
        self.selected: list[str | None] = []
        self._in_lang = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "form" and found.get("id") == "search-form":
            self.form = found
        elif tag == "input" and found.get("id") == "query":
            self.query = found
        elif tag == "select":
            self._in_lang = found.get("id") == "lang"
        elif tag == "option" and self._in_lang and "selected" in found:
            self.selected.append(found.get("value"))


def fields(client: httpx.Client, **params: str) -> FormFields:
    response = client.get("/", params=params)
    assert response.status_code == 200, response.text
    parser = FormFields()
    parser.feed(response.text)
    return parser


def test_shared_link_prefills_and_runs(client: httpx.Client) -> None:
    query = 'roter <b>"Becher"</b> & Teller'
    page = fields(client, q=query, lang="de")
    assert page.query["value"] == query  # escaped in the HTML, the same text once parsed
    assert page.selected == ["de"]
    assert page.form.get("data-autorun") == "1"


def test_plain_page_and_blank_query_do_not_run(client: httpx.Client) -> None:
    for params in ({}, {"q": "   "}, {"lang": "ja"}):
        page = fields(client, **params)
        assert "data-autorun" not in page.form, params
        assert page.query.get("value") == ""
    assert fields(client, lang="ja").selected == ["ja"]
    assert fields(client).selected == []
