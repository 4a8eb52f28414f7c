"""The validity dates of the certificates the gateway presents and trusts, read with ``cryptography``
(docs/deploy.md, "TLS"). A certificate outside its dates is refused by the other side of the handshake, so
``tls.py`` refuses to present one; here are the dates, the warnings of a certificate close to its end or a CA out of
its dates, and ``CertificatesInUse``, which shows the dates in use on
``switchyard_tls_certificate_expiry_timestamp_seconds`` and says when one in use crosses into its last days or past
its end."""

from __future__ import annotations

import datetime
import logging
from collections.abc import Iterable
from dataclasses import dataclass

from cryptography import x509
from prometheus_client import Gauge

log = logging.getLogger(__name__)

EXPIRY_WARNING = datetime.timedelta(days=14)
"""A certificate in use is warned of from this long before its notAfter ..."""
EXPIRY_WARNING_SHARE = 0.2
"""... or from the last fifth of its lifetime when that is shorter: a certificate issued for a day (a service
mesh's, renewed when a third of it is left) is not close to its end for the whole of its day."""

FINE, CLOSE, OUTSIDE = 0, 1, 2
"""A certificate's state at a moment, in the order a certificate in use goes through them."""


def utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def when(moment: datetime.datetime) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def span(length: datetime.timedelta) -> str:
    """``3 days 4 hours``, ``1 hour 12 minutes``, ``40 seconds``: what a person reads in a log line."""
    seconds = int(length.total_seconds())
    days, hours, minutes = seconds // 86400, seconds // 3600 % 24, seconds // 60 % 60
    if days:
        return f"{_count(days, 'day')} {_count(hours, 'hour')}"
    if hours:
        return f"{_count(hours, 'hour')} {_count(minutes, 'minute')}"
    return _count(minutes, "minute") if minutes else _count(seconds, "second")


def _count(number: int, unit: str) -> str:
    return f"{number} {unit}" if number == 1 else f"{number} {unit}s"


@dataclass(frozen=True)
class Dates:
    """One certificate: who it names, and when it is valid."""

    subject: str
    serial: str
    not_before: datetime.datetime
    not_after: datetime.datetime

    @property
    def warned_from(self) -> datetime.datetime:
        lifetime = self.not_after - self.not_before
        return self.not_after - min(EXPIRY_WARNING, lifetime * EXPIRY_WARNING_SHARE)

    def state(self, now: datetime.datetime) -> int:
        if now < self.not_before or now > self.not_after:
            return OUTSIDE
        return CLOSE if now >= self.warned_from else FINE

    def outside(self, now: datetime.datetime) -> str | None:
        """Why the certificate is not valid at ``now`` (its date and the current time), or None."""
        if now > self.not_after:
            return f"expired at {when(self.not_after)} (notAfter), and it is now {when(now)}"
        if now < self.not_before:
            return f"is not valid before {when(self.not_before)} (notBefore), and it is now {when(now)}"
        return None


@dataclass(frozen=True)
class FileCertificates:
    """The certificates of one file that the gateway uses: a chain's first (the one presented; the others may be
    cross-signatures a client does not need, an expired one among them on purpose), or every CA of a bundle."""

    setting: str
    """The setting naming the file (``tls_cert_file``): the gauge's ``setting`` label."""
    named: str
    """How the logs name it: the variable and the path."""
    certificates: tuple[Dates, ...]
    consequence: str
    """What a certificate of this file outside its dates does (``clients refuse it in the handshake``)."""
    presented: bool
    """A certificate the gateway presents (a chain), not CAs it trusts."""

    def message(self, dates: Dates, now: datetime.datetime) -> str:
        """The log line for ``dates`` at ``now`` (close to its end, or outside its dates)."""
        which = "certificate" if self.presented else "CA certificate"
        outside = dates.outside(now)
        if outside is not None:
            return f"{self.named} holds a {which} ({dates.subject}) that {outside}: {self.consequence}"
        return (f"{self.named} holds a {which} ({dates.subject}) that expires in {span(dates.not_after - now)}, at "
                f"{when(dates.not_after)} (notAfter): write a renewed one there before then (it is taken up without "
                "a restart)")


def read_dates(pem: bytes, named: str, *, chain: bool) -> tuple[Dates, ...]:
    """The dates of the PEM certificates in ``pem`` (a chain's first only). A file OpenSSL took and ``cryptography``
    cannot parse is served as before, with a warning that its dates go unchecked."""
    try:
        found = x509.load_pem_x509_certificates(pem)
    except ValueError as exc:
        log.warning("%s: the certificates' dates are not checked, cryptography cannot read them: %s", named, exc)
        return ()
    return tuple(_dates(certificate) for certificate in (found[:1] if chain else found))


def _dates(certificate: x509.Certificate) -> Dates:
    return Dates(certificate.subject.rfc4514_string(), format(certificate.serial_number, "x"),
                 certificate.not_valid_before_utc, certificate.not_valid_after_utc)


class CertificatesInUse:
    """The certificates one side uses now (the listeners', or the channels to Triton's): their notAfter on the gauge,
    warnings when they are taken up close to their end (or CAs outside their dates), and one line when a certificate
    in use crosses into its last days or past its end (``tick``, from the side's watcher)."""

    def __init__(self, gauge: Gauge | None = None) -> None:
        self._gauge = gauge
        self._files: dict[str, FileCertificates] = {}
        self._told: dict[tuple[str, str], int] = {}
        """The state last told of each certificate in use, by setting and serial."""
        self._shown: set[tuple[str, str, str]] = set()

    def use(self, files: Iterable[FileCertificates], *, announce: bool = True,
            now: datetime.datetime | None = None) -> None:
        """From now on ``files`` are in use; ``announce``: log what is close to its end or outside its dates
        (the start check does, once, for the node; each process's own objects take them up quietly)."""
        now = now or utc_now()
        for file in files:
            self._files[file.setting] = file
        self._told = {}
        for file, dates in self._each():
            state = self._told[file.setting, dates.serial] = dates.state(now)
            if announce and state != FINE:
                self._log(file, dates, now)
        self._show()

    def tick(self, now: datetime.datetime | None = None) -> None:
        """Log a certificate in use that crossed into its last days or past its end since the last look."""
        now = now or utc_now()
        for file, dates in self._each():
            state, told = dates.state(now), self._told.get((file.setting, dates.serial), FINE)
            if state > told:
                self._log(file, dates, now)
            self._told[file.setting, dates.serial] = state

    def _each(self) -> Iterable[tuple[FileCertificates, Dates]]:
        return ((file, dates) for file in self._files.values() for dates in file.certificates)

    @staticmethod
    def _log(file: FileCertificates, dates: Dates, now: datetime.datetime) -> None:
        # A presented certificate outside its dates fails every handshake: an error. A CA out of its dates fails
        # only the certificates it signed, which the bundle's other CAs may not need: a warning.
        level = logging.ERROR if file.presented and dates.outside(now) else logging.WARNING
        log.log(level, "%s", file.message(dates, now))

    def _show(self) -> None:
        if self._gauge is None:
            return
        shown = {(file.setting, dates.subject, dates.serial): dates.not_after.timestamp()
                 for file, dates in self._each()}
        for gone in self._shown - shown.keys():
            self._gauge.remove(*gone)
        for labels, not_after in shown.items():
            self._gauge.labels(*labels).set(not_after)
        self._shown = set(shown)
