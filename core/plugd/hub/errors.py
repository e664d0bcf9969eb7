"""The Hub's refusals and failures as plugd's transfer errors, each saying what the user can do."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import httpx2
from huggingface_hub import constants
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from plugd.hub.reference import HubReference
from plugd.registry.errors import AuthenticationFailed, RegistryError, RegistryUnreachable, UnknownModel


class AccessDenied(RegistryError):
    status = 403


TOKEN_HINT = ("give the daemon a token: HF_TOKEN in its environment, or `hf auth login` as its user "
              "(HF_HOME decides where that is kept)")


@contextmanager
def hub_errors(ref: HubReference) -> Iterator[None]:
    endpoint = constants.ENDPOINT
    try:
        yield
    except RevisionNotFoundError:
        raise UnknownModel(f"{ref.source} has no revision {ref.revision!r}: the tag of an hf.co name is a branch, "
                           "tag or commit of the repository") from None
    except GatedRepoError as exc:  # a kind of RepositoryNotFoundError: this comes first
        page = f"{endpoint}/{ref.repo_id}"
        if exc.response.status_code == 403:
            raise AccessDenied(f"{ref.source} is a gated repository and the daemon's token has not been granted "
                               f"access to it: ask for access at {page}") from None
        raise AuthenticationFailed(f"{ref.source} is a gated repository: ask for access at {page}, then "
                                   f"{TOKEN_HINT}") from None
    except RepositoryNotFoundError:
        raise UnknownModel(f"no repository {ref.repo_id} on the Hugging Face Hub ({endpoint}): check the name, "
                           f"whose case counts; for a private repository, {TOKEN_HINT}") from None
    except HfHubHTTPError as exc:
        if exc.response.status_code == 401:
            raise AuthenticationFailed(f"the Hugging Face Hub ({endpoint}) refused the daemon's token as invalid; "
                                       f"{TOKEN_HINT}, or remove it to pull public repositories") from None
        raise RegistryError(f"the Hugging Face Hub ({endpoint}) failed: {str(exc).splitlines()[0]}") from None
    except (httpx2.TransportError, LocalEntryNotFoundError) as exc:
        raise RegistryUnreachable(f"the Hugging Face Hub ({endpoint}) is unreachable: {str(exc).splitlines()[0]}") from None
