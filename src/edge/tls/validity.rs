//! A certificate's validity period (RFC 5280 §4.1.2.5), read from its DER. Every client
//! that verifies the server refuses a certificate outside it, so the server never puts
//! one in force: at start-up it refuses to start, and a rotation to one keeps the
//! certificate in force (see the module above).
//!
//! Only the way to the dates is walked: `Certificate ::= SEQUENCE { tbsCertificate, … }`,
//! `TBSCertificate ::= SEQUENCE { [0] version OPTIONAL, serialNumber INTEGER, signature
//! SEQUENCE, issuer SEQUENCE, validity SEQUENCE { notBefore Time, notAfter Time }, … }`,
//! `Time ::= UTCTime | GeneralizedTime`. rustls checks the rest of the certificate.

use jiff::Timestamp;
use jiff::civil::DateTime;
use jiff::tz::TimeZone;

/// When a certificate starts and stops being valid (both instants included).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Validity {
    pub not_before: Timestamp,
    pub not_after: Timestamp,
}

const INTEGER: u8 = 0x02;
const SEQUENCE: u8 = 0x30;
const VERSION: u8 = 0xa0;
const UTC_TIME: u8 = 0x17;
const GENERALIZED_TIME: u8 = 0x18;

impl Validity {
    /// The validity period of the certificate `der`; an error says what does not read.
    pub fn of(der: &[u8]) -> Result<Validity, &'static str> {
        let certificate = Der(der).expect(SEQUENCE)?;
        let mut tbs = Der(Der(certificate).expect(SEQUENCE)?);
        if tbs.0.first() == Some(&VERSION) {
            tbs.next()?;
        }
        tbs.expect(INTEGER)?;
        tbs.expect(SEQUENCE)?;
        tbs.expect(SEQUENCE)?;
        let mut validity = Der(tbs.expect(SEQUENCE)?);
        Ok(Validity {
            not_before: time(validity.next()?)?,
            not_after: time(validity.next()?)?,
        })
    }

    /// Whether the period holds `now`; if not, why, with both dates.
    pub fn check(&self, now: Timestamp) -> Result<(), String> {
        let period = format!("valid from {} to {}", self.not_before, self.not_after);
        if now < self.not_before {
            return Err(format!(
                "the certificate is not valid before {} ({period})",
                self.not_before
            ));
        }
        if now > self.not_after {
            return Err(format!(
                "the certificate expired at {} ({period})",
                self.not_after
            ));
        }
        Ok(())
    }
}

/// DER elements one after another.
struct Der<'a>(&'a [u8]);

impl<'a> Der<'a> {
    /// The next element's tag and contents.
    fn next(&mut self) -> Result<(u8, &'a [u8]), &'static str> {
        const TRUNCATED: &str = "the certificate is cut short";
        let [tag, length, rest @ ..] = self.0 else {
            return Err(TRUNCATED);
        };
        if tag & 0x1f == 0x1f {
            return Err("a tag of several bytes where the dates should be");
        }
        let (length, rest) = match *length {
            short @ 0..0x80 => (usize::from(short), rest),
            long => {
                let count = usize::from(long & 0x7f);
                if count == 0 || count > 4 || rest.len() < count {
                    return Err("a length DER does not allow");
                }
                let (bytes, rest) = rest.split_at(count);
                let length = (bytes.iter()).fold(0usize, |n, &byte| n << 8 | usize::from(byte));
                (length, rest)
            }
        };
        if rest.len() < length {
            return Err(TRUNCATED);
        }
        let (contents, after) = rest.split_at(length);
        self.0 = after;
        Ok((*tag, contents))
    }

    /// The contents of the next element, which must be a `tag`.
    fn expect(&mut self, tag: u8) -> Result<&'a [u8], &'static str> {
        match self.next()? {
            (found, contents) if found == tag => Ok(contents),
            _ => Err("not laid out as an X.509 certificate"),
        }
    }
}

/// A `Time`: UTCTime `YYMMDDHHMMSSZ` (years 1950 to 2049) or GeneralizedTime
/// `YYYYMMDDHHMMSSZ`, the two forms RFC 5280 allows.
fn time((tag, contents): (u8, &[u8])) -> Result<Timestamp, &'static str> {
    const UNREADABLE: &str = "a validity date that does not read";
    let (year, rest) = match (tag, contents.len()) {
        (UTC_TIME, 13) => {
            let year = number(&contents[..2]).ok_or(UNREADABLE)?;
            (
                if year < 50 { 2000 + year } else { 1900 + year },
                &contents[2..],
            )
        }
        (GENERALIZED_TIME, 15) => (number(&contents[..4]).ok_or(UNREADABLE)?, &contents[4..]),
        _ => return Err(UNREADABLE),
    };
    let [fields @ .., b'Z'] = rest else {
        return Err(UNREADABLE);
    };
    let mut parts = fields.chunks(2).map(number);
    let mut part = || parts.next().flatten().ok_or(UNREADABLE);
    let (month, day, hour, minute, second) = (part()?, part()?, part()?, part()?, part()?);
    let narrow = |value: u16| i8::try_from(value).map_err(|_| UNREADABLE);
    let year = i16::try_from(year).map_err(|_| UNREADABLE)?;
    let civil = DateTime::new(
        year,
        narrow(month)?,
        narrow(day)?,
        narrow(hour)?,
        narrow(minute)?,
        narrow(second)?,
        0,
    )
    .map_err(|_| UNREADABLE)?;
    let zoned = civil.to_zoned(TimeZone::UTC).map_err(|_| UNREADABLE)?;
    Ok(zoned.timestamp())
}

/// The decimal number `digits` spell (ASCII digits only).
fn number(digits: &[u8]) -> Option<u16> {
    (!digits.is_empty() && digits.iter().all(u8::is_ascii_digit))
        .then(|| (digits.iter()).fold(0, |n, &digit| n * 10 + u16::from(digit - b'0')))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A DER element: `tag`, a length in the shortest form, `contents`.
    fn element(tag: u8, contents: &[u8]) -> Vec<u8> {
        let mut out = vec![tag];
        match contents.len() {
            short @ 0..0x80 => out.push(short as u8),
            long @ 0..0x100 => out.extend([0x81, long as u8]),
            long => out.extend([0x82, (long >> 8) as u8, long as u8]),
        }
        out.extend_from_slice(contents);
        out
    }

    /// A certificate laid out as RFC 5280 says, with the two times given (tag, text).
    fn certificate(version: bool, not_before: (u8, &str), not_after: (u8, &str)) -> Vec<u8> {
        let mut tbs = Vec::new();
        if version {
            tbs.extend(element(VERSION, &element(INTEGER, &[2])));
        }
        tbs.extend(element(INTEGER, &[0x01, 0x23]));
        tbs.extend(element(SEQUENCE, &element(0x06, &[0x2a, 0x86, 0x48])));
        // An issuer long enough to take a long-form length.
        tbs.extend(element(SEQUENCE, &element(0x31, &[b'x'; 200])));
        let mut validity = element(not_before.0, not_before.1.as_bytes());
        validity.extend(element(not_after.0, not_after.1.as_bytes()));
        tbs.extend(element(SEQUENCE, &validity));
        tbs.extend(element(SEQUENCE, b"subject and the rest"));
        let mut body = element(SEQUENCE, &tbs);
        body.extend(element(SEQUENCE, b"signature algorithm"));
        body.extend(element(0x03, b"signature"));
        element(SEQUENCE, &body)
    }

    fn at(text: &str) -> Timestamp {
        text.parse().expect("a timestamp")
    }

    #[test]
    fn both_time_forms_read_with_or_without_a_version() {
        for version in [true, false] {
            let der = certificate(
                version,
                (UTC_TIME, "491231235959Z"),
                (GENERALIZED_TIME, "20500101000000Z"),
            );
            assert_eq!(
                Validity::of(&der),
                Ok(Validity {
                    not_before: at("2049-12-31T23:59:59Z"),
                    not_after: at("2050-01-01T00:00:00Z"),
                })
            );
        }
    }

    #[test]
    fn a_two_digit_year_from_50_is_in_the_1900s() {
        let der = certificate(
            true,
            (UTC_TIME, "500101000000Z"),
            (UTC_TIME, "991231000000Z"),
        );
        let validity = Validity::of(&der).expect("reads");
        assert_eq!(validity.not_before, at("1950-01-01T00:00:00Z"));
        assert_eq!(validity.not_after, at("1999-12-31T00:00:00Z"));
    }

    #[test]
    fn the_check_names_why_and_both_dates() {
        let validity = Validity {
            not_before: at("2020-01-01T00:00:00Z"),
            not_after: at("2020-01-02T00:00:00Z"),
        };
        assert_eq!(validity.check(at("2020-01-01T12:00:00Z")), Ok(()));
        assert_eq!(validity.check(at("2020-01-02T00:00:00Z")), Ok(()));
        let expired = validity
            .check(at("2020-01-02T00:00:01Z"))
            .expect_err("late");
        assert_eq!(
            expired,
            "the certificate expired at 2020-01-02T00:00:00Z (valid from \
             2020-01-01T00:00:00Z to 2020-01-02T00:00:00Z)"
        );
        let early = validity
            .check(at("2019-12-31T23:59:59Z"))
            .expect_err("early");
        assert!(early.starts_with("the certificate is not valid before 2020-01-01T00:00:00Z"));
    }

    #[test]
    fn times_rfc_5280_does_not_allow_are_refused() {
        for (tag, text) in [
            (UTC_TIME, "2001010000Z"),
            (UTC_TIME, "200101000000+0100"),
            (UTC_TIME, "20013100000AZ"),
            (UTC_TIME, "201301000000Z"),
            (GENERALIZED_TIME, "20200101000000.5Z"),
            (0x04, "200101000000Z"),
        ] {
            let der = certificate(true, (tag, text), (UTC_TIME, "300101000000Z"));
            assert!(Validity::of(&der).is_err(), "{text} read");
        }
    }

    #[test]
    fn a_certificate_cut_short_anywhere_is_refused_not_a_panic() {
        let der = certificate(
            true,
            (UTC_TIME, "200101000000Z"),
            (UTC_TIME, "300101000000Z"),
        );
        for length in 0..der.len() {
            assert!(Validity::of(&der[..length]).is_err(), "cut at {length}");
        }
        assert!(
            Validity::of(b"\x30\x80\x00\x00").is_err(),
            "indefinite length"
        );
        assert!(
            Validity::of(b"\x30\x85\x01\x00\x00\x00\x00").is_err(),
            "five length bytes"
        );
    }
}
