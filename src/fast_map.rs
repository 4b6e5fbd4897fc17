//! The hash map of the hot paths: maps keyed by ids and tool names that every
//! call or every live model session's catalog sync looks into.

/// A `HashMap` hashed with foldhash instead of SipHash. SipHash of a 30-byte
/// id costs about 500 instructions, and a registration into every role looked
/// up its live sessions' characters, cached sessions and registries hundreds
/// of times (BENCHMARKS.md, issue 20). foldhash's state is still seeded at
/// random per map, so keys a client chooses cannot be aimed at one bucket
/// ahead of time.
pub type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// A `HashSet` hashed like [`FastMap`].
pub type FastSet<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;
