# ruff: noqa: E501  (the lines of a real dump and of real wikitext are long)
"""Small Wikipedia ``pages-articles`` XML dumps written the way dumps.wikimedia.org writes them
(MediaWiki export 0.10: <siteinfo>, one <page> per article, the wikitext XML-escaped inside
<text>), for the tests of ``prepare-bert``'s Wikipedia input."""

from __future__ import annotations

from pathlib import Path
from xml.sax.saxutils import escape

HEAD = """<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/" xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" version="0.10" xml:lang="en">
  <siteinfo>
    <sitename>Wikipedia</sitename>
    <dbname>enwiki</dbname>
    <base>https://en.wikipedia.org/wiki/Main_Page</base>
    <generator>MediaWiki 1.41.0-wmf.1</generator>
    <case>first-letter</case>
    <namespaces>
      <namespace key="0" case="first-letter" />
      <namespace key="1" case="first-letter">Talk</namespace>
      <namespace key="10" case="first-letter">Template</namespace>
    </namespaces>
  </siteinfo>
"""

# An article with what real ones hold: templates (a short description, an infobox spanning
# lines), bold, internal links with and without labels, references with citation templates,
# a section heading, an external link, a table, a category.
ANARCHISM = """{{Short description|Political philosophy and movement}}
{{Infobox ideology
| name = Anarchism
| color = black
}}
'''Anarchism''' is a [[political philosophy]] and [[Political movement|movement]] that is skeptical of all justifications for authority.<ref name="McLaughlin">{{cite book |last=McLaughlin |first=Paul |title=Anarchism and Authority |year=2007}}</ref> It seeks to abolish the [[institution]]s it claims maintain unnecessary [[coercion]]. Dr. Smith wrote about it in 1890.

== History ==
The word was coined in the 1640s.<ref>Oxford English Dictionary, p. 12.</ref> See the [https://example.org external site] for more.

{| class="wikitable"
! Year !! Event
|-
| 1840 || Proudhon
|}
Modern anarchism emerged from the [[Age of Enlightenment|Enlightenment]].

[[Category:Anarchism]]
"""
ANARCHISM_DOC = ["Anarchism is a political philosophy and movement that is skeptical of all "
                 "justifications for authority.",
                 "It seeks to abolish the institutions it claims maintain unnecessary coercion.",
                 "Dr. Smith wrote about it in 1890.",
                 "The word was coined in the 1640s.",
                 "See the external site for more.",
                 "Modern anarchism emerged from the Enlightenment."]
ALBEDO = ("'''Albedo''' is the measure of the [[diffuse reflection]] of [[sunlight]]. "
          "It is measured on a scale from 0 to 1.<ref>{{cite web |url=https://example.org}}</ref>\n")
ALBEDO_DOC = ["Albedo is the measure of the diffuse reflection of sunlight.",
              "It is measured on a scale from 0 to 1."]

SAMPLE_PAGES = [
    {"title": "Anarchism", "ns": 0, "id": 12, "text": ANARCHISM},
    {"title": "AccessibleComputing", "ns": 0, "id": 10, "redirect": "Computer accessibility",
     "text": "#REDIRECT [[Computer accessibility]]\n\n{{Redirect category shell|{{R from move}}}}"},
    {"title": "Mercury (disambiguation)", "ns": 0, "id": 14,
     "text": "'''Mercury''' may refer to:\n* [[Mercury (planet)]], the closest planet to the Sun.\n"
             "* [[Mercury (element)]], a chemical element.\n\n{{disambiguation}}"},
    {"title": "Bass", "ns": 0, "id": 17,
     "text": "'''Bass''' may mean low sounds or a fish.\n\n{{Disambiguation|music}}"},
    {"title": "Template:Infobox ideology", "ns": 10, "id": 15,
     "text": "{| class=\"infobox\"\n| {{{name}}}\n|}"},
    {"title": "Talk:Anarchism", "ns": 1, "id": 16, "text": "This is a talk page. Please sign your posts."},
    {"title": "Albedo", "ns": 0, "id": 39, "text": ALBEDO},
]
SAMPLE_DOCS = [ANARCHISM_DOC, ALBEDO_DOC]


def page_xml(page: dict) -> str:
    redirect = f'    <redirect title="{escape(page["redirect"])}" />\n' if page.get("redirect") else ""
    return (f"  <page>\n    <title>{escape(page['title'])}</title>\n    <ns>{page['ns']}</ns>\n"
            f"    <id>{page['id']}</id>\n{redirect}    <revision>\n      <id>{page['id'] + 1000}</id>\n"
            f"      <timestamp>2024-01-01T00:00:00Z</timestamp>\n"
            f"      <model>wikitext</model>\n      <format>text/x-wiki</format>\n"
            f'      <text bytes="{len(page["text"].encode())}" xml:space="preserve">'
            f"{escape(page['text'], {chr(34): '&quot;'})}</text>\n"
            f"    </revision>\n  </page>\n")


def dump_xml(pages: list[dict]) -> str:
    return HEAD + "".join(page_xml(p) for p in pages) + "</mediawiki>\n"


def write_dump(path: Path, pages: list[dict] = SAMPLE_PAGES) -> Path:
    """Write ``pages`` as a dump at ``path``, compressed by its suffix (.bz2, .gz, .xz)."""
    import bz2
    import gzip
    import lzma

    data = dump_xml(pages).encode("utf-8")
    opener = {".bz2": bz2.open, ".gz": gzip.open, ".xz": lzma.open}.get(path.suffix)
    if opener is None:
        path.write_bytes(data)
    else:
        with opener(path, "wb") as f:
            f.write(data)
    return path


def article_pages(docs: list[list[str]], first_id: int = 100) -> list[dict]:
    """Articles whose text is ``docs``' sentences (one paragraph each, with some markup that
    extraction removes: bold, links, a reference)."""
    pages = []
    for i, doc in enumerate(docs):
        words = doc[0].split(" ")
        first = " ".join([f"'''{words[0]}'''", *[f"[[{w}]]" if j == 2 else w for j, w in enumerate(words[1:], 1)]])
        body = " ".join([first, *doc[1:]])
        pages.append({"title": f"Article {i}", "ns": 0, "id": first_id + i,
                      "text": f"{{{{Short description|Article {i}}}}}\n{body}<ref>Source {i}.</ref>\n"})
    return pages
