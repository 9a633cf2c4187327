"""A hub pull: which variant of the repository, then its files into the store.

:func:`plan_pull` lists the repository and picks the variant: the one the spec names
(a quantization, any case, or a file), the only one, or the one the planner
chooses for this box (``choose``, handed in by the composition root) with its
reason. The answer, a :class:`HubPull`, carries the files with the sizes and
sha256 of the listing, so the job downloads exactly what was checked.
:func:`run_pull` downloads them through the resumable, verified downloader: a
single GGUF file, every part of a split set (the job's total is the sum of the
parts), or a safetensors folder.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from appliance.errors import BadRequest
from appliance.jsontypes import JsonObject
from appliance.modelfacts import ModelFacts
from appliance.store.download import Downloader, remove_partial
from appliance.store.errors import RefusedImport
from appliance.store.hub.client import HubClient
from appliance.store.hub.listing import GgufSet, HubFile, family_of, files_from_tree, gguf_sets, hf_selection
from appliance.store.hub.spec import HubSpec
from appliance.store.installs import Installer
from appliance.store.jobs import JobContext
from appliance.store.paths import check_part
from appliance.store.variants import AvailableVariant, VariantInfo

__all__ = ["Candidate", "Chooser", "HubPull", "files_from_tree", "plan_pull", "run_pull", "offers_of"]


@dataclass(frozen=True)
class Candidate:
    """A GGUF variant of a repository as the planner sees it: facts from one header, the size from the listing."""

    name: str
    quantization: str | None
    size_bytes: int
    facts: ModelFacts


Chooser = Callable[[str, Sequence[Candidate]], tuple[str, str]]
"""``choose(family, candidates) -> (variant name, reason)``; raises when none fits this box."""


@dataclass(frozen=True)
class HubPull:
    spec: HubSpec
    family: str
    variant: str
    format: str  # gguf | safetensors
    files: tuple[HubFile, ...]
    reason: str
    found: tuple[GgufSet, ...]

    @property
    def name(self) -> str:
        return f"{self.family}:{self.variant}"

    @property
    def size_bytes(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def source(self) -> str:
        """What the store records as the variant's source (``hf:ORG/REPO/FILE``, with ``@REVISION`` unless main)."""
        return (
            str(HubSpec(self.spec.repo, self.spec.revision, file=self.files[0].path))
            if self.format == "gguf"
            else str(HubSpec(self.spec.repo, self.spec.revision))
        )

    def to_dict(self) -> JsonObject:
        return {
            "name": self.name,
            "source": self.source,
            "format": self.format,
            "size_bytes": self.size_bytes,
            "files": len(self.files),
            "reason": self.reason,
            "variants": [
                {
                    "variant": s.variant,
                    "quantization": s.quant,
                    "size_bytes": s.size,
                    "files": [{"path": f.path, "size_bytes": f.size, "sha256": f.sha256} for f in s.files],
                }
                for s in self.found
            ],
        }


def offers_of(pull: HubPull, *, with_pulled: bool = False) -> list[AvailableVariant]:
    """The repository's GGUF variants as ``available`` rows: every one the pull leaves on the hub (and, with
    ``with_pulled``, the one it pulls, under the name it installs as)."""
    offers = []
    for s in pull.found:
        pulled = s.files == pull.files
        if (pulled and not with_pulled) or (not pulled and s.variant == pull.variant):
            continue
        spec = HubSpec(pull.spec.repo, pull.spec.revision, file=s.files[0].path)
        offers.append(AvailableVariant(pull.variant if pulled else s.variant, s.quant, s.size, str(spec)))
    return offers


def plan_pull(client: HubClient, spec: HubSpec, *, name: str | None = None, choose: Chooser | None = None) -> HubPull:
    """List the repository and decide what to pull; 4xx errors for a bad spec, an unsafe listing or no match."""
    family, named_variant = _name_parts(name, spec)
    files = client.list_files(spec)
    sets = gguf_sets(files)
    if not sets:
        if spec.quant or spec.file:
            raise BadRequest(f"{spec.repo} holds no GGUF files", param="url", code="variant_not_found")
        chosen = tuple(hf_selection(files))
        return HubPull(
            spec,
            family,
            named_variant or "hf",
            "safetensors",
            chosen,
            f"{spec.repo} holds safetensors weights: {len(chosen)} files for vLLM",
            (),
        )
    chosen_set, reason = _pick(client, spec, family, sets, choose)
    return HubPull(spec, family, named_variant or chosen_set.variant, "gguf", chosen_set.files, reason, tuple(sets))


def _name_parts(name: str | None, spec: HubSpec) -> tuple[str, str | None]:
    if name is None:
        return family_of(spec.repo), None
    family, _, variant = name.partition(":")
    return check_part(family, "family"), check_part(variant, "variant") if variant else None


def _available(sets: Sequence[GgufSet]) -> str:
    return ", ".join(s.quant or s.variant for s in sets)


def _pick(client: HubClient, spec: HubSpec, family: str, sets: list[GgufSet], choose: Chooser | None) -> tuple[GgufSet, str]:
    if spec.file is not None:
        for s in sets:
            if s.files[0].path == spec.file:
                return s, f"{spec.file} as named"
        if any(f.path == spec.file for s in sets for f in s.files):
            raise BadRequest(
                f"{spec.file} is not the first part of its split set; name the -00001-of- file",
                param="url",
                code="variant_not_found",
            )
        raise BadRequest(f"{spec.repo} has no GGUF model file {spec.file}", param="url", code="variant_not_found")
    if spec.quant is not None:
        matches = [s for s in sets if (s.quant or s.variant).lower() == spec.quant.lower()]
        if len(matches) == 1:
            return matches[0], f"{matches[0].quant or matches[0].variant} as named"
        what = "several files" if matches else "no file"
        raise BadRequest(
            f"{spec.repo} has {what} of quantization {spec.quant}; it holds {_available(sets)}"
            + ("; name the file instead" if matches else ""),
            param="url",
            code="variant_not_found",
        )
    if len(sets) == 1:
        return sets[0], f"the only GGUF variant of {spec.repo}"
    facts = client.probe_facts(spec, sets[0].files[0]) if choose is not None else None
    if choose is None or facts is None:
        raise BadRequest(f"name a quantization: {spec.repo} holds {_available(sets)}", param="url", code="variant_not_found")
    # One architecture, many quantizations: the probed header's shape holds for all; the weights are the file sizes.
    candidates = [
        Candidate(s.variant, s.quant, s.size, replace(facts, file_type=s.quant, tensor_bytes=None, nonlayer_bytes=None))
        for s in sets
    ]
    variant, reason = choose(family, candidates)
    picked = next((s for s in sets if s.variant == variant), None)
    if picked is None:
        raise RefusedImport(f"the planner chose {variant}, which {spec.repo} does not hold")
    return picked, f"chosen by the planner for this box: {reason}"


def run_pull(pull: HubPull, client: HubClient, installer: Installer, ctx: JobContext) -> VariantInfo:
    """Download the pull's files into the store (resumable, each verified against the listing's sha256)."""
    total = pull.size_bytes
    starts = [sum(f.size for f in pull.files[:i]) for i in range(len(pull.files))]

    def fetch(index: int, partial: Path) -> str:
        f = pull.files[index]
        return (
            Downloader(
                client.resolve_url(pull.spec, f.path),
                partial,
                allow=client.allow,
                ctx=ctx.within(starts[index], total),
                expected_sha256=f.sha256,
                credentials=client.credentials,
            )
            .run()
            .sha256
        )

    def resumable(exc: BaseException) -> bool:
        return not isinstance(exc, BadRequest)  # bad bytes are never kept

    ctx.progress(0, total, message=pull.reason)
    if pull.format == "safetensors":

        def fetch_file(relative: str, target: Path) -> str:
            index = next(i for i, f in enumerate(pull.files) if f.path == relative)
            partial = target.with_name(target.name + ".partial")
            digest = fetch(index, partial)
            os.replace(partial, target)
            remove_partial(partial)
            return digest

        return installer.install_hf_files(
            pull.family, pull.variant, source=pull.source, ctx=ctx, files=[(f.path, f.size) for f in pull.files], write=fetch_file
        )
    if len(pull.files) == 1:
        return installer.install_gguf(
            pull.family, pull.variant, source=pull.source, ctx=ctx, write=lambda partial: fetch(0, partial), resumable=resumable
        )
    return installer.install_gguf_parts(
        pull.family,
        pull.variant,
        source=pull.source,
        ctx=ctx,
        count=len(pull.files),
        write=lambda number, partial: fetch(number - 1, partial),
        resumable=resumable,
    )
