//! Human units in configuration: durations (`10m`, `250ms`) and byte sizes (`64MiB`, `1KB`).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A duration written the human way (`30s`, `10m`, `1h 30m`, `250ms`), parsed by `humantime`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct HumanDuration(pub std::time::Duration);

impl HumanDuration {
    pub const fn from_secs(s: u64) -> Self {
        HumanDuration(std::time::Duration::from_secs(s))
    }
    pub const fn from_millis(ms: u64) -> Self {
        HumanDuration(std::time::Duration::from_millis(ms))
    }
    pub fn get(self) -> std::time::Duration {
        self.0
    }
}

impl FromStr for HumanDuration {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        humantime::parse_duration(s.trim())
            .map(HumanDuration)
            .map_err(|e| format!("{s:?} is not a duration ({e}); write e.g. 250ms, 30s, 10m, 1h"))
    }
}

impl fmt::Display for HumanDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", humantime::format_duration(self.0))
    }
}

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl Serialize for HumanDuration {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// A byte size written the human way (`64MiB`, `1 KiB`, `512KB`, `1048576`), parsed by
/// `bytesize`. A bare number is bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct ByteSize(pub u64);

impl ByteSize {
    pub const fn kib(n: u64) -> Self {
        ByteSize(n * 1024)
    }
    pub const fn mib(n: u64) -> Self {
        ByteSize(n * 1024 * 1024)
    }
    pub fn bytes(self) -> u64 {
        self.0
    }
}

impl FromStr for ByteSize {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        s.trim()
            .parse::<bytesize::ByteSize>()
            .map(|b| ByteSize(b.as_u64()))
            .map_err(|e| format!("{s:?} is not a byte size ({e}); write e.g. 512KiB, 64MiB, 1GB"))
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", bytesize::ByteSize(self.0).display().iec())
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            N(u64),
            S(String),
        }
        match Raw::deserialize(d)? {
            Raw::N(n) => Ok(ByteSize(n)),
            Raw::S(s) => s.parse().map_err(serde::de::Error::custom),
        }
    }
}

impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!("10m".parse::<HumanDuration>().unwrap().0.as_secs(), 600);
        assert_eq!("250ms".parse::<HumanDuration>().unwrap().0.as_millis(), 250);
        assert!("ten".parse::<HumanDuration>().is_err());
    }

    #[test]
    fn sizes() {
        assert_eq!("64MiB".parse::<ByteSize>().unwrap().0, 64 << 20);
        assert_eq!("1KiB".parse::<ByteSize>().unwrap().0, 1024);
        assert_eq!("1KB".parse::<ByteSize>().unwrap().0, 1000);
        assert_eq!("1 MiB".parse::<ByteSize>().unwrap().0, 1 << 20);
        assert!("lots".parse::<ByteSize>().is_err());
    }
}
