//! Parsers for the human units users type: sizes (`256M`, `1.5GiB`) and durations (`5s`, `250ms`).

use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A duration written as `"10m"`, `"30s"`, `"250ms"` or a number of seconds (config files
/// and request bodies).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Dur(pub Duration);

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Secs(u64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Secs(s) => Ok(Dur(Duration::from_secs(s))),
            Raw::Text(t) => parse_duration(&t)
                .map(Dur)
                .map_err(serde::de::Error::custom),
        }
    }
}

impl Serialize for Dur {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&format_duration(self.0))
    }
}

/// A byte size written as `"256M"`, `"1.5GiB"` or a number of bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Size(pub u64);

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Bytes(u64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Bytes(b) => Ok(Size(b)),
            Raw::Text(t) => parse_size(&t).map(Size).map_err(serde::de::Error::custom),
        }
    }
}

#[cfg(feature = "schema")]
impl schemars::JsonSchema for Dur {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Duration".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "A duration: \"250ms\", \"30s\", \"10m\", \"1h\", or a number of seconds.",
            "anyOf": [
                {"type": "string"},
                {"type": "integer", "minimum": 0}
            ]
        })
    }
}

#[cfg(feature = "schema")]
impl schemars::JsonSchema for Size {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "ByteSize".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "A byte size: \"256M\", \"1.5GiB\", \"64k\", or a number of bytes.",
            "anyOf": [
                {"type": "string"},
                {"type": "integer", "minimum": 0}
            ]
        })
    }
}

impl Serialize for Size {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(self.0)
    }
}

/// Parses a byte size: a number with an optional unit. `k`, `M`, `G`, `T` (and the `KiB`,
/// `MiB`, ... spellings) are powers of 1024, as memory limits are usually meant; `KB`, `MB`,
/// `GB` with an explicit `B` after a capital are powers of 1000. A bare number is bytes.
pub fn parse_size(input: &str) -> Result<u64, String> {
    let (value, unit) = number_and_unit(input, "size", ["256M, 1G or 65536", "256M or 1.5G"])?;
    let mult: f64 = match unit {
        "" | "b" | "B" => 1.0,
        "k" | "K" | "KiB" | "kiB" | "Ki" => 1024.0,
        "m" | "M" | "MiB" | "Mi" => 1024.0 * 1024.0,
        "g" | "G" | "GiB" | "Gi" => 1024.0 * 1024.0 * 1024.0,
        "t" | "T" | "TiB" | "Ti" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        "kB" | "KB" => 1e3,
        "MB" => 1e6,
        "GB" => 1e9,
        "TB" => 1e12,
        other => {
            return Err(format!(
                "size {input:?} has an unknown unit {other:?}; use k, M, G or T (powers of 1024)"
            ));
        }
    };
    let bytes = value * mult;
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
        return Err(format!("size {input:?} is out of range"));
    }
    Ok(bytes.round() as u64)
}

/// Parses a duration: a number with `ms`, `s`, `m` or `h`; a bare number is seconds.
pub fn parse_duration(input: &str) -> Result<Duration, String> {
    let (value, unit) = number_and_unit(input, "duration", ["5s, 250ms or 2m", "5s or 250ms"])?;
    let secs = match unit {
        "" | "s" | "sec" | "secs" => value,
        "ms" => value / 1e3,
        "us" | "µs" => value / 1e6,
        "m" | "min" => value * 60.0,
        "h" => value * 3600.0,
        other => {
            return Err(format!(
                "duration {input:?} has an unknown unit {other:?}; use ms, s, m or h"
            ));
        }
    };
    Duration::try_from_secs_f64(secs).map_err(|_| format!("duration {input:?} is out of range"))
}

/// The number at the start of `input` and the unit after it (trimmed). Errors name the
/// quantity (`what`) and show how to write one: `like[0]` where there is no number,
/// `like[1]` where it does not parse.
fn number_and_unit<'a>(
    input: &'a str,
    what: &str,
    like: [&str; 2],
) -> Result<(f64, &'a str), String> {
    let s = input.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    if num.is_empty() {
        return Err(format!(
            "{what} {input:?} has no number; write it like {}",
            like[0]
        ));
    }
    let value: f64 = num.parse().map_err(|_| {
        format!(
            "{what} {input:?} is not a number; write it like {}",
            like[1]
        )
    })?;
    Ok((value, unit.trim()))
}

/// Formats a byte count for people: `64.0 MiB`.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut i = 0;
    while v >= 1024.0 && i < UNITS.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[i])
    }
}

/// Formats a duration for people with a sensible unit.
pub fn format_duration(d: Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us < 1000.0 {
        format!("{us:.0} µs")
    } else if us < 1e6 {
        format!("{:.2} ms", us / 1e3)
    } else {
        format!("{:.2} s", us / 1e6)
    }
}

/// How long ago a figure was measured, for people: `just now`, `5 min ago`, `3 h ago`,
/// `12 d ago`. `measured_unix` later than `now_unix` (a clock moved back) reads `just now`.
pub fn format_age(measured_unix: u64, now_unix: u64) -> String {
    let s = now_unix.saturating_sub(measured_unix);
    match s {
        0..60 => "just now".to_string(),
        60..3600 => format!("{} min ago", s / 60),
        3600..86_400 => format!("{} h ago", s / 3600),
        _ => format!("{} d ago", s / 86_400),
    }
}

/// Seconds since the Unix epoch now (0 on a clock set before 1970).
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("256M").unwrap(), 256 << 20);
        assert_eq!(parse_size("64MiB").unwrap(), 64 << 20);
        assert_eq!(parse_size("1.5G").unwrap(), 3 << 29);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("10MB").unwrap(), 10_000_000);
        assert!(parse_size("M").is_err());
        assert!(parse_size("12 parsecs").is_err());
        assert!(parse_size("-1M").is_err());
        assert!(parse_size("1e400").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("5s").unwrap(), Duration::from_secs(5));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("3").unwrap(), Duration::from_secs(3));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("5 fortnights").is_err());
    }

    #[test]
    fn formatting() {
        assert_eq!(format_size(512), "512 B");
        assert_eq!(format_size(64 << 20), "64.0 MiB");
        assert_eq!(format_duration(Duration::from_micros(350)), "350 µs");
        assert_eq!(format_age(100, 130), "just now");
        assert_eq!(format_age(200, 100), "just now");
        assert_eq!(format_age(0, 5 * 60), "5 min ago");
        assert_eq!(format_age(0, 3 * 3600 + 7), "3 h ago");
        assert_eq!(format_age(0, 12 * 86_400), "12 d ago");
    }
}
