"""Regenerate the demo corpus `bmx_rerank/data/python_docs.jsonl` from the running Python's stdlib.

Each document is one public function, class or method of a standard-library module: `title` is its
qualified name, `text` the first paragraphs of its docstring. CPython and its docstrings are under the
PSF License 2.0 (an OSI-approved open licence), which allows redistribution with the notice kept; see
`bmx_rerank/data/LICENSE-python-docs.txt`.

Run: python scripts/make_sample_corpus.py   (the shipped file was made with CPython 3.11.7)
"""

from __future__ import annotations

import importlib
import inspect
import json
import sys
import warnings
from pathlib import Path

MODULES = """
abc argparse array asyncio base64 bisect bz2 calendar cmath codecs collections colorsys configparser
contextlib copy csv dataclasses datetime decimal difflib email.message email.utils enum fileinput
fnmatch fractions ftplib functools getpass gettext glob gzip hashlib heapq hmac html html.parser
http.client http.cookies http.server imaplib inspect io ipaddress itertools json logging lzma mailbox
math mimetypes mmap multiprocessing operator os os.path pathlib pickle platform poplib pprint queue
quopri random re secrets select selectors shelve shlex shutil signal smtplib socket sqlite3 ssl
statistics string struct subprocess tarfile tempfile textwrap threading time timeit tokenize traceback
types typing unicodedata urllib.parse urllib.request uuid warnings weakref xml.dom.minidom
xml.etree.ElementTree zipfile zlib zoneinfo
""".split()

OUT = Path(__file__).resolve().parents[1] / "bmx_rerank" / "data" / "python_docs.jsonl"


def summary(doc: str, limit: int = 700) -> str:
    """The docstring's first paragraphs, up to about `limit` characters."""
    text = " ".join(inspect.cleandoc(doc).split("\n\n")[:3]).replace("\n", " ")
    return " ".join(text.split())[:limit]


def entries(module_name: str):
    module = importlib.import_module(module_name)
    for name, obj in sorted(vars(module).items()):
        if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
            continue
        if not (inspect.isfunction(obj) or inspect.isbuiltin(obj) or inspect.isclass(obj)):
            continue
        yield f"{module_name}.{name}", obj
        if inspect.isclass(obj):
            for mname, meth in sorted(vars(obj).items()):
                if not mname.startswith("_") and callable(meth):
                    yield f"{module_name}.{name}.{mname}", meth


def main() -> None:
    warnings.simplefilter("ignore")
    seen: set[str] = set()
    docs = []
    for module_name in MODULES:
        for qualname, obj in entries(module_name):
            doc = inspect.getdoc(obj)
            if not doc or len(doc) < 40:
                continue
            text = summary(doc)
            if text in seen:
                continue
            seen.add(text)
            docs.append({"_id": qualname, "title": qualname, "text": text})
    with OUT.open("w") as fh:
        for d in docs:
            fh.write(json.dumps(d, ensure_ascii=False) + "\n")
    print(f"{len(docs)} documents from Python {sys.version.split()[0]} -> {OUT}", file=sys.stderr)


if __name__ == "__main__":
    main()
