//! Deterministic identifiers: UUIDs, VM name suffixes and secrets drawn from one seeded generator,
//! so that the same seed and the same sequence of requests give the same ids.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Source of every id the simulator hands out.
#[derive(Debug)]
pub(crate) struct IdGen {
    rng: StdRng,
    /// Stands in for CloudStack's `currentTimeMillis()` in VM name suffixes: it only grows, so
    /// names sort in creation order as they do on a real CloudStack.
    clock_ms: u64,
}

impl IdGen {
    pub(crate) fn new(seed: u64) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        // Around 2025 in epoch milliseconds: 11 hex digits, like real names.
        let clock_ms = 0x199_0000_0000 + rng.random_range(0..0x1000_0000u64);
        Self { rng, clock_ms }
    }

    /// A random (version 4) UUID in its usual lower-case text form.
    pub(crate) fn uuid(&mut self) -> String {
        let mut b: [u8; 16] = self.rng.random();
        b[6] = (b[6] & 0x0f) | 0x40;
        b[8] = (b[8] & 0x3f) | 0x80;
        let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
        format!(
            "{}-{}-{}-{}-{}",
            &h[0..8],
            &h[8..12],
            &h[12..16],
            &h[16..20],
            &h[20..32]
        )
    }

    /// The hex suffix CloudStack appends to node VM names (`Long.toHexString(currentTimeMillis)`).
    pub(crate) fn name_suffix(&mut self) -> String {
        self.clock_ms += self.rng.random_range(1..=997u64);
        format!("{:x}", self.clock_ms)
    }

    /// A random value in `[0, 1)`, for fault decisions.
    pub(crate) fn unit(&mut self) -> f64 {
        self.rng.random::<f64>()
    }

    /// A URL-safe random key (API key or secret key), as long as CloudStack's (86 characters).
    pub(crate) fn key(&mut self) -> String {
        const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
        (0..86)
            .map(|_| ALPHABET[self.rng.random_range(0..ALPHABET.len())] as char)
            .collect()
    }
}

/// True when `s` has the shape of a UUID (8-4-4-4-12 hex digits).
pub(crate) fn is_uuid(s: &str) -> bool {
    let parts: Vec<&str> = s.split('-').collect();
    parts.len() == 5
        && parts
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(p, n)| p.len() == n && p.bytes().all(|c| c.is_ascii_hexdigit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_ids() {
        let (mut a, mut b) = (IdGen::new(7), IdGen::new(7));
        assert_eq!(a.uuid(), b.uuid());
        assert_eq!(a.name_suffix(), b.name_suffix());
        assert_ne!(IdGen::new(8).uuid(), IdGen::new(7).uuid());
    }

    #[test]
    fn uuid_shape_and_growing_suffixes() {
        let mut g = IdGen::new(1);
        let u = g.uuid();
        assert!(is_uuid(&u), "{u}");
        assert!(!is_uuid("not-a-uuid"));
        let (s1, s2) = (g.name_suffix(), g.name_suffix());
        assert_eq!(s1.len(), 11);
        assert!(s2 > s1);
    }
}
