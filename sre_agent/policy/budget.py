"""Per-request budgets and the process-wide retry budget.

:class:`Budget` bounds one logical request: attempts, tokens, dollars and a
wall-clock deadline. Every attempt first *reserves* its worst case (an upper
bound on input tokens plus the output cap it will send) and the output cap is
shrunk to what the budget can still pay for, so no path can exceed any limit
as long as the server honours the cap it was sent.

:class:`RetryBudget` is Finagle's retry budget (``RetryBudget.scala``): every
first attempt deposits, every retry or hedge withdraws ``1/ratio`` deposits,
deposits expire after ``ttl_s`` and a reserve of ``min_retries_per_s * ttl_s``
withdrawals keeps low-traffic clients able to retry. During a full outage the
attempts over any ``ttl_s`` window are therefore at most
``requests * (1 + ratio) + min_retries_per_s * ttl_s``.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from sre_agent.errors import PolicyError
from sre_agent.policy.outcome import Pricing

__all__ = ["Budget", "BudgetLimits", "Reservation", "RetryBudget"]

Clock = Callable[[], float]

_floor = math.floor  # one global lookup instead of two on the per-attempt path


@dataclass(frozen=True, slots=True)
class BudgetLimits:
    """Limits for one logical request; None means unlimited.

    Attributes:
        max_attempts: HTTP attempts including the first, retries, hedges, fallbacks and tool turns.
        max_tokens: input plus output tokens over all attempts.
        max_usd: dollars over all attempts (needs pricing to be meaningful).
        deadline_s: seconds from the start of the request until an answer is useless.
    """

    max_attempts: int = 4
    max_tokens: int | None = None
    max_usd: float | None = None
    deadline_s: float | None = None

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise PolicyError("max_attempts must be at least 1")
        for name in ("max_tokens", "max_usd", "deadline_s"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise PolicyError(f"{name} must not be negative")


@dataclass(frozen=True, slots=True, init=False)
class Reservation:
    """What one attempt may spend at most: its input bound, output cap, dollars and time."""

    input_tokens: int
    max_output_tokens: int
    usd: float
    timeout_s: float | None

    def __init__(self, input_tokens: int, max_output_tokens: int, usd: float, timeout_s: float | None) -> None:
        # One per attempt. Setting the slots through their descriptors skips the generic
        # object.__setattr__ of the generated frozen __init__ (about 40% of its cost).
        _set_input_tokens(self, input_tokens)
        _set_max_output_tokens(self, max_output_tokens)
        _set_usd(self, usd)
        _set_timeout_s(self, timeout_s)


_set_input_tokens = Reservation.__dict__["input_tokens"].__set__
_set_max_output_tokens = Reservation.__dict__["max_output_tokens"].__set__
_set_usd = Reservation.__dict__["usd"].__set__
_set_timeout_s = Reservation.__dict__["timeout_s"].__set__


class Budget:
    """Spend so far for one logical request against its :class:`BudgetLimits`.

    Not thread-safe: one request's attempts (and its hedges, on one event loop) share it.
    ``clock`` returns seconds (monotonic); tests pass a fake one.
    """

    __slots__ = ("_clock", "attempts", "limits", "started_s", "tokens", "usd")

    def __init__(self, limits: BudgetLimits, clock: Clock = time.monotonic) -> None:
        self.limits = limits
        self._clock = clock
        self.started_s = clock()
        self.attempts = 0
        self.tokens = 0
        self.usd = 0.0

    def elapsed_s(self) -> float:
        """Seconds since the request started."""
        return self._clock() - self.started_s

    def remaining_s(self) -> float | None:
        """Seconds left before the deadline (never negative), or None without a deadline."""
        if self.limits.deadline_s is None:
            return None
        return max(self.limits.deadline_s - self.elapsed_s(), 0.0)

    def fits_time(self, seconds: float) -> bool:
        """True when ``seconds`` more still end before the deadline."""
        # remaining_s() inlined (max() spelt as a test): the stop strategy asks before every retry.
        deadline = self.limits.deadline_s
        if deadline is None:
            return True
        remaining = deadline - (self._clock() - self.started_s)
        return seconds <= (0.0 if remaining < 0.0 else remaining)

    def reserve(
        self,
        input_tokens_bound: int,
        wanted_output_tokens: int,
        pricing: Pricing | None,
        attempt_timeout_s: float | None,
        min_output_tokens: int = 1,
    ) -> Reservation | None:
        """Reserve the worst case of one more attempt, or None when the budget cannot pay for it.

        The output cap is lowered to what the token and dollar limits still allow; when that is
        below ``min_output_tokens`` the attempt is refused. The timeout is the smaller of
        ``attempt_timeout_s`` and the time left (None: no bound).
        """
        # Runs before every attempt: remaining_s() inlined and each limit read once.
        limits = self.limits
        if self.attempts >= limits.max_attempts:
            return None
        remaining_s: float | None = None
        deadline_s = limits.deadline_s
        if deadline_s is not None:
            remaining_s = deadline_s - (self._clock() - self.started_s)
            if remaining_s <= 0.0:
                return None
        # Comparisons instead of min(): a builtin call costs more than the test, twice per attempt.
        cap = wanted_output_tokens
        max_tokens = limits.max_tokens
        if max_tokens is not None:
            left_tokens = max_tokens - self.tokens - input_tokens_bound
            if left_tokens < cap:  # noqa: PLR1730
                cap = left_tokens
        max_usd = limits.max_usd
        if max_usd is not None and pricing is not None:
            left_usd = max_usd - self.usd - input_tokens_bound * pricing.input_per_mtok / 1e6
            output_price = pricing.output_per_mtok
            if output_price > 0:
                affordable = _floor(left_usd * 1e6 / output_price)
                if affordable < cap:  # noqa: PLR1730
                    cap = affordable
            elif left_usd < 0:
                cap = -1
        if cap < min_output_tokens:
            return None
        timeout = attempt_timeout_s
        if remaining_s is not None and (timeout is None or remaining_s < timeout):
            timeout = remaining_s
        usd = pricing.worst_case_usd(input_tokens_bound, cap) if pricing is not None else 0.0
        self.attempts += 1
        return Reservation(input_tokens_bound, cap, usd, timeout)

    def charge(self, reservation: Reservation, tokens: int | None, usd: float | None) -> None:
        """Record an attempt's spend; None (unknown, e.g. after a timeout) charges the reservation in full."""
        self.tokens += reservation.input_tokens + reservation.max_output_tokens if tokens is None else tokens
        self.usd += reservation.usd if usd is None else usd

    def exceeded(self) -> list[str]:
        """Names of the limits that spend has gone past (empty when within budget)."""
        limits = self.limits
        over = []
        if self.attempts > limits.max_attempts:
            over.append("attempts")
        if limits.max_tokens is not None and self.tokens > limits.max_tokens:
            over.append("tokens")
        if limits.max_usd is not None and self.usd > limits.max_usd + 1e-12:
            over.append("usd")
        if limits.deadline_s is not None and self.elapsed_s() > limits.deadline_s + 1e-9:
            over.append("deadline")
        return over


class RetryBudget:
    """Finagle-style retry budget shared by every request of a process (thread-safe).

    Args:
        ratio: retries (and hedges) allowed per first attempt, e.g. 0.2.
        min_retries_per_s: retries allowed regardless of traffic, per second.
        ttl_s: how long a deposit counts, seconds (Finagle allows 1-60).
        clock: monotonic seconds; injectable.
    """

    def __init__(
        self, ratio: float = 0.2, min_retries_per_s: float = 10.0, ttl_s: float = 10.0, clock: Clock = time.monotonic
    ) -> None:
        if not 0.0 <= ratio <= 1000.0:
            raise PolicyError("ratio must be within 0..1000")
        if not 1.0 <= ttl_s <= 60.0:
            raise PolicyError("ttl_s must be within 1..60 seconds")
        if min_retries_per_s < 0:
            raise PolicyError("min_retries_per_s must not be negative")
        self.ratio = ratio
        self.min_retries_per_s = min_retries_per_s
        self.ttl_s = ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        # Integer units as in Finagle: a deposit is 1000, a withdrawal 1000/ratio.
        self._deposit_units = 1000
        self._withdraw_units = math.inf if ratio == 0 else 1000.0 / ratio
        self._reserve_units = 0.0 if ratio == 0 else min_retries_per_s * ttl_s * self._withdraw_units
        self._deposits: deque[tuple[float, int]] = deque()
        self._withdrawals: deque[tuple[float, float]] = deque()
        # Running sums over the live window, so a decision is O(1) amortised, not O(traffic).
        self._deposited = 0.0
        self._withdrawn = 0.0
        self.deposits_total = 0
        self.withdrawals_total = 0
        self.refusals_total = 0

    def _expire(self, now: float) -> None:
        horizon = now - self.ttl_s
        deposits, withdrawals = self._deposits, self._withdrawals
        if (not deposits or deposits[0][0] > horizon) and (not withdrawals or withdrawals[0][0] > horizon):
            return  # nothing expired: the usual case, and the resets below already happened when a side emptied
        while deposits and deposits[0][0] <= horizon:
            self._deposited -= deposits.popleft()[1]
        while withdrawals and withdrawals[0][0] <= horizon:
            self._withdrawn -= withdrawals.popleft()[1]
        if not deposits:
            self._deposited = 0.0  # drop accumulated float error whenever a side empties
        if not withdrawals:
            self._withdrawn = 0.0

    def _balance(self) -> float:
        return self._deposited - self._withdrawn + self._reserve_units

    def deposit(self) -> None:
        """Record a first attempt (earns the right to ``ratio`` retries)."""
        with self._lock:
            now = self._clock()
            self._expire(now)
            self._deposits.append((now, self._deposit_units))
            self._deposited += self._deposit_units
            self.deposits_total += 1

    def try_withdraw(self) -> bool:
        """Take one retry (or hedge) from the budget; False means: do not retry."""
        if self._withdraw_units == math.inf:
            with self._lock:
                self.refusals_total += 1
            return False
        with self._lock:
            now = self._clock()
            self._expire(now)
            units = self._withdraw_units
            # _balance() inlined: this runs before every retry of every request.
            if self._deposited - self._withdrawn + self._reserve_units < units:
                self.refusals_total += 1
                return False
            self._withdrawals.append((now, units))
            self._withdrawn += units
            self.withdrawals_total += 1
            return True

    @property
    def balance(self) -> float:
        """Retries available right now (in withdrawals, fractional)."""
        with self._lock:
            self._expire(self._clock())
            units = self._balance()
        return 0.0 if self._withdraw_units == math.inf else units / self._withdraw_units
