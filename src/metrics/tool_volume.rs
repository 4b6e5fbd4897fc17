//! Calls per remote/MCP tool name, for a counter whose label set stays
//! bounded however many names there are: the 50 busiest names are rendered,
//! the rest summed as `other`. The map itself is capped too: once it holds
//! [`MAX_TRACKED`] names, new names count only towards `other`.

use std::collections::HashMap;
use std::sync::Mutex;

/// Names rendered with their own series.
pub const TOP_NAMES: usize = 50;
/// Names tracked at all.
const MAX_TRACKED: usize = 10_000;

/// Calls by tool name.
#[derive(Default)]
pub struct ToolVolume {
    inner: Mutex<Volume>,
}

#[derive(Default)]
struct Volume {
    by_name: HashMap<String, u64>,
    untracked: u64,
}

impl ToolVolume {
    pub fn count(&self, name: &str) {
        let mut volume = self.inner.lock().expect("tool volume lock");
        if let Some(count) = volume.by_name.get_mut(name) {
            *count += 1;
        } else if volume.by_name.len() < MAX_TRACKED {
            volume.by_name.insert(name.to_owned(), 1);
        } else {
            volume.untracked += 1;
        }
    }

    /// The busiest names with their counts, busiest first, and the sum of
    /// all others.
    pub fn top(&self) -> (Vec<(String, u64)>, u64) {
        let volume = self.inner.lock().expect("tool volume lock");
        let mut all: Vec<(String, u64)> = volume
            .by_name
            .iter()
            .map(|(name, count)| (name.clone(), *count))
            .collect();
        all.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        let rest: u64 = all.iter().skip(TOP_NAMES).map(|(_, c)| c).sum::<u64>() + volume.untracked;
        all.truncate(TOP_NAMES);
        (all, rest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_busiest_names_are_kept_and_the_rest_summed() {
        let volume = ToolVolume::default();
        for i in 0..1000 {
            volume.count(&format!("tool_{i}"));
        }
        for _ in 0..5 {
            volume.count("busy");
        }
        let (top, rest) = volume.top();
        assert_eq!(top.len(), TOP_NAMES);
        assert_eq!(top[0], ("busy".to_owned(), 5));
        assert_eq!(top.iter().map(|(_, c)| c).sum::<u64>() + rest, 1005);
    }
}
