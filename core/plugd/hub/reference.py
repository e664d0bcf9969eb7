"""`hf.co/ORG/REPO[:REVISION]` (or `huggingface.co/...`): which Hub repository and revision, and the store name."""

from __future__ import annotations

from attrs import define

from plugd.store.names import DEFAULT_TAG, InvalidName, ModelName

HUB_HOSTS = ("hf.co", "huggingface.co")
STORE_HOST = "hf.co"
DEFAULT_REVISION = "main"


def is_hub_host(host: str) -> bool:
    return host.lower() in HUB_HOSTS


@define(frozen=True)
class HubReference:
    repo_id: str  # as typed: the Hub's URLs are case-sensitive, while store names are lowercased
    revision: str  # a branch, tag or commit; the default tag `latest` is the default branch
    name: ModelName  # where the model is stored, always under hf.co

    @classmethod
    def parse(cls, text: str) -> HubReference:
        name = ModelName.parse(text)
        if not is_hub_host(name.host):
            raise InvalidName(f"{text!r} is not a Hugging Face Hub name (hf.co/ORG/REPO[:REVISION])")
        repo_id = text.split("/", 1)[1]
        revision = DEFAULT_REVISION
        if ":" in repo_id.rsplit("/", 1)[1]:
            repo_id, typed_tag = repo_id.rsplit(":", 1)
            if typed_tag.lower() != DEFAULT_TAG:
                revision = typed_tag
        return cls(repo_id, revision, ModelName(STORE_HOST, name.namespace, name.model, name.tag))

    @property
    def source(self) -> str:
        return f"{STORE_HOST}/{self.repo_id}"
