//! pprof string table with deduplication.
//!
//! Invariant: `table[0] == ""` and every string appears once; `index` maps each
//! string to its position in `table`.

use std::collections::HashMap;

/// A pprof string table under construction: every distinct string gets one
/// index, `""` is index 0. The default table holds only `""`.
#[derive(Debug)]
pub struct StringTable {
    table: Vec<String>,
    index: HashMap<String, i64>,
}

impl Default for StringTable {
    fn default() -> Self {
        StringTable { table: vec![String::new()], index: HashMap::from([(String::new(), 0)]) }
    }
}

impl StringTable {
    /// Index of `s`, added on first use.
    pub fn intern(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.index.get(s) {
            return i;
        }
        let i = self.table.len() as i64;
        self.table.push(s.to_string());
        self.index.insert(s.to_string(), i);
        i
    }

    /// The strings in index order, for [`Profile::string_table`](crate::pprof::Profile::string_table).
    pub fn into_vec(self) -> Vec<String> {
        self.table
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn dedups_and_keeps_empty_first() {
        let mut t = super::StringTable::default();
        assert_eq!(t.intern(""), 0);
        assert_eq!(t.intern("a"), 1);
        assert_eq!(t.intern("b"), 2);
        assert_eq!(t.intern("a"), 1);
        assert_eq!(t.into_vec(), ["", "a", "b"]);
    }
}
