"""Who may do what: tenants, the roles a token carries, and the caller a request runs as.

Records and checks only (the store keeps TokenRecords; api/auth.py turns a bearer token
into a Caller). The API checks the role before it looks anything up (permission before
existence, AIP-193) and scopes every lookup to the caller's tenant."""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from .errors import InvalidArgument, PermissionDenied

TENANT = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
DEFAULT_TENANT = "default"


class Role(StrEnum):
    """Stored in tokens.role. Each role may do everything the ones below it may."""

    # Everything in its tenant, plus what reaches the whole node: faults with no workspace,
    # node silence, a lost storage pool. For whoever runs the machine, never for a tenant.
    OPERATOR = "operator"
    # Everything in its tenant.
    ADMIN = "admin"
    # Reads in its tenant.
    READER = "reader"
    # A node agent (issue 13): the node API only, acting as one node (the token's `tenant`
    # field holds that node's ID); refused by every tenant service.
    NODE = "node"


# How much each role may do; a role may do what any lower-ranked role may.
# A node token ranks below every tenant role (and tenant services refuse it outright).
RANK: dict[Role, int] = {Role.NODE: -1, Role.READER: 0, Role.ADMIN: 1, Role.OPERATOR: 2}


@dataclass(frozen=True)
class Caller:
    tenant: str
    role: Role

    def require_admin(self, what: str) -> None:
        if RANK[self.role] < RANK[Role.ADMIN]:
            raise PermissionDenied(f"{what} needs an admin token; this token is read-only")

    def require_operator(self, what: str) -> None:
        if RANK[self.role] < RANK[Role.OPERATOR]:
            raise PermissionDenied(
                f"{what} reaches every workspace on the node and needs an operator token",
                hint=(
                    "an operator token is made on the server's machine: kibo-ctrl token create --tenant "
                    f"{self.tenant} --role operator (a new server's first admin.token is one on SQLite)"
                ),
            )


# The caller when authentication is switched off (--insecure-no-auth): whoever reaches the
# server owns the machine, so it may do everything, node-wide faults included.
LOCAL_OPERATOR = Caller(DEFAULT_TENANT, Role.OPERATOR)


def tenant_name(value: str) -> str:
    if not TENANT.fullmatch(value):
        raise InvalidArgument("a tenant is 1 to 63 lowercase letters, digits and '-'", field="tenant")
    return value


@dataclass(frozen=True)
class TokenRecord:
    id: str
    tenant: str
    role: Role
    create_time: float
    revoked: bool = False
