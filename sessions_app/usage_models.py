"""Usage of the models (one row per model call) and budgets that cap it.

Only `sessions_app.lifecycle` writes these rows; usage rows name their run and session by
number (no foreign key), so pruning transcripts keeps the aggregates.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models


class UsageRecord(models.Model):
    """One model call's usage: written once, in the transaction that ends the call."""

    run_pk = models.BigIntegerField(null=True, blank=True)  # the run's row, gone once pruned
    step = models.PositiveIntegerField()  # the call's step within its run (1 = the first request)
    run_id = models.CharField(max_length=128, blank=True, default="")
    session_pk = models.BigIntegerField(null=True, blank=True)
    session_key = models.CharField(max_length=220, blank=True, default="")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    api_token_id = models.BigIntegerField(null=True, blank=True)  # the API key of an HTTP run
    agent_id = models.CharField(max_length=64)
    model = models.CharField(max_length=200, blank=True, default="")
    input_tokens = models.BigIntegerField(default=0)
    output_tokens = models.BigIntegerField(default=0)
    cached_tokens = models.BigIntegerField(default=0)
    reasoning_tokens = models.BigIntegerField(default=0)
    estimated = models.BooleanField(default=False)  # the backend reported none: counted from text
    unknown = models.BooleanField(default=False)  # its process died mid-call: nobody knows what it cost
    cost_micros = models.BigIntegerField(null=True, blank=True)  # USD millionths; NULL: no price configured
    day = models.DateField()
    created_at = models.DateTimeField()

    class Meta:
        constraints = [
            # a step's usage is recorded once, however often its writer retries
            models.UniqueConstraint(fields=["run_pk", "step"], name="uniq_usage_run_step"),
        ]
        indexes = [
            models.Index(fields=["day", "agent_id", "model"], name="usage_day_agent_model"),
            models.Index(fields=["user", "day"], name="usage_user_day"),
            models.Index(fields=["session_pk"], name="usage_session"),
            models.Index(fields=["created_at", "id"], name="usage_created_id"),
        ]

    def __str__(self) -> str:
        return f"{self.run_id} step {self.step}: {self.input_tokens}+{self.output_tokens} tokens"

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens


class BudgetScope(models.TextChoices):
    USER = "user"
    GROUP = "group"
    AGENT = "agent"
    API_KEY = "api_key"


class BudgetPeriod(models.TextChoices):
    DAY = "day"
    WEEK = "week"
    MONTH = "month"
    TOTAL = "total"


class Budget(models.Model):
    """A cap on tokens and/or cost for a user, a group's members (each), an agent or an API key, per period.

    `used_*` counts the current period's settled usage; `reserved_*` what admitted runs may still
    spend (their estimate, settled call by call and released when they end).
    """

    name = models.CharField(max_length=100, blank=True, default="")
    scope = models.CharField(max_length=16, choices=BudgetScope.choices)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    group = models.ForeignKey("auth.Group", null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    agent_id = models.CharField(max_length=64, blank=True, default="")
    api_token = models.ForeignKey(
        "sessions_app.ApiToken", null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    period = models.CharField(max_length=8, choices=BudgetPeriod.choices, default=BudgetPeriod.MONTH)
    max_tokens = models.BigIntegerField(null=True, blank=True)
    max_cost_micros = models.BigIntegerField(null=True, blank=True, help_text="USD millionths")
    period_start = models.DateTimeField(null=True, blank=True)
    used_tokens = models.BigIntegerField(default=0)
    used_cost_micros = models.BigIntegerField(default=0)
    reserved_tokens = models.BigIntegerField(default=0)
    reserved_cost_micros = models.BigIntegerField(default=0)
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [
            models.Index(fields=["scope", "user"], name="budget_scope_user"),
            models.Index(fields=["scope", "agent_id"], name="budget_scope_agent"),
        ]

    def __str__(self) -> str:
        subject = self.user or self.group or self.agent_id or self.api_token
        return self.name or f"{self.scope} {subject} ({self.period})"
