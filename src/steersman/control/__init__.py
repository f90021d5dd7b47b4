"""Admission control: tenants and API keys, rate limits and budgets, workflows, the gateway queue.

Everything here is pure: it takes ``now`` (seconds from the injected clock) and
data and returns typed decisions, with no IO, no clock reads and no asyncio, so
the gateway and the discrete-event digital twin drive the same code.
"""

from steersman.control.admission import (
    Admit, AdmissionDecision, Admitter, DefaultAdmitter, Infeasible, Refusal, TooManyInFlight, check_deadline,
)
from steersman.control.budget import BudgetLedger, OverBudget
from steersman.control.queue import Enqueued, GatewayQueue, Shed
from steersman.control.ratelimit import RateLimiter, Reservation, Throttle, TokenBucket, TooLarge
from steersman.control.tenants import (
    AuthError, TenantConfig, TenantConfigError, TenantDirectory, generate_key, hash_key, load_tenants,
)
from steersman.control.workflow import (
    WorkflowHeaderError, WorkflowHeaders, WorkflowTracker, parse_workflow_headers, protection_value,
)

__all__ = [
    "Admit", "AdmissionDecision", "Admitter", "DefaultAdmitter", "Infeasible", "Refusal", "TooManyInFlight", "check_deadline",
    "BudgetLedger", "OverBudget",
    "Enqueued", "GatewayQueue", "Shed",
    "RateLimiter", "Reservation", "Throttle", "TokenBucket", "TooLarge",
    "AuthError", "TenantConfig", "TenantConfigError", "TenantDirectory", "generate_key", "hash_key", "load_tenants",
    "WorkflowHeaderError", "WorkflowHeaders", "WorkflowTracker", "parse_workflow_headers", "protection_value",
]
