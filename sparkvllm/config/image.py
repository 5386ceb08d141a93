"""The vLLM image every node runs."""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Literal

from pydantic import Field, field_validator, model_validator

from sparkvllm.config.values import _IMAGE_REF, _Closed, _node_path


class ImageConfig(_Closed):
    """The vLLM image every node runs (the same image ID everywhere)."""

    ref: str = Field(
        description="Image reference, e.g. hellohal2064/vllm-qwen3.5-gb10:latest. It must "
        "contain vLLM with the model's architecture (and Ray, for parallelism.launcher ray)."
    )
    source: Literal["pull", "tarball", "present"] = Field(
        "pull",
        description="How the head obtains the image once: `pull` from its registry, "
        "`tarball` (docker load -i a file on the head), or `present` (already loaded on the "
        "head). Other nodes always receive it from the head over the cluster link.",
    )
    tarball: str | None = Field(
        None,
        description="Absolute path ON THE HEAD NODE of a `docker save` tarball "
        "(source: tarball only).",
    )
    arch: Literal["aarch64", "x86_64"] = Field(
        "aarch64",
        description="CPU architecture the image is built for; every node must match "
        "(DGX Spark: aarch64).",
    )
    remove_on_destroy: bool = Field(
        False,
        description="Remove the image from the nodes on `pulumi destroy`. Default keeps it: "
        "images are large caches that the next deployment reuses.",
    )

    @field_validator("ref")
    @classmethod
    def _ref_grammar(cls, v: str) -> str:
        if len(v) > 255 or not _IMAGE_REF.match(v):
            raise ValueError(
                "not a Docker image reference ([registry[:port]/]name[:tag][@sha256:...], "
                "lowercase name); fix: e.g. hellohal2064/vllm-qwen3.5-gb10:latest"
            )
        return v

    @property
    def digest(self) -> str | None:
        """The `sha256:...` the reference pins, or None (a tag, which may move)."""
        return self.ref.split("@", 1)[1] if "@" in self.ref else None

    @property
    def repository(self) -> str:
        """The reference without tag or digest."""
        name = self.ref.split("@", 1)[0]
        last = name.rsplit("/", 1)[-1]
        return name[: len(name) - len(last)] + last.split(":", 1)[0]

    @property
    def moving(self) -> bool:
        """No digest and the tag `latest` (or none, which means latest)."""
        if self.digest:
            return False
        last = self.ref.rsplit("/", 1)[-1]
        return ":" not in last or last.split(":", 1)[1] == "latest"

    @property
    def local_ref(self) -> str:
        """What every node runs and checks: the reference itself, or for a digest-pinned
        one a local tag that names the digest (`repo:sha256-<hex>`): a registry digest
        exists only where the image was pulled, and `docker save | docker load` carries
        tags, not digests, to the other nodes."""
        if not self.digest:
            return self.ref
        return f"{self.repository}:{self.digest.replace(':', '-')}"

    @field_validator("tarball")
    @classmethod
    def _tarball_path(cls, v: str | None) -> str | None:
        return None if v is None else _node_path(v)

    @model_validator(mode="after")
    def _tarball_rules(self) -> ImageConfig:
        if self.digest and self.source == "tarball":
            raise ValueError(
                f"ref {self.ref} pins a registry digest, which `docker load` of a tarball does "
                "not record; fix: use source: pull (or present, for an image pulled by that "
                "digest), or give the tarball's tag as ref"
            )
        if self.digest and not self.digest.startswith("sha256:"):
            raise ValueError(
                f"ref {self.ref}: only sha256 digests are supported; fix: use @sha256:<64 hex>"
            )
        if self.digest and len(self.digest) != len("sha256:") + 64:
            raise ValueError(
                f"ref {self.ref}: a sha256 digest has 64 hex digits; fix: copy it whole"
            )
        if self.digest and self.digest != self.digest.lower():
            # distribution/reference digest.go: the encoded part is lower-case hex (docker
            # refuses "invalid reference format" at the pull, after the plan).
            raise ValueError(
                f"ref {self.ref}: a digest is lower-case hex; fix: write it in lower case"
            )
        if self.source == "tarball":
            if not self.tarball or not PurePosixPath(self.tarball).is_absolute():
                raise ValueError(
                    "source is tarball but tarball is not an absolute path on the head; "
                    "fix: set image.tarball, e.g. /var/lib/images/vllm.tar"
                )
        elif self.tarball is not None:
            raise ValueError(
                f"tarball is set but source is {self.source!r}; fix: set source: tarball "
                "or remove tarball"
            )
        return self
