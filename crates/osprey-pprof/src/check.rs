//! Consistency of a decoded pprof: what makes bytes that happen to parse as
//! protobuf (a text file, a truncated raw profile) a profile.
//!
//! Invariant checked: `string_table[0] == ""`; at least one sample type;
//! every sample has one value per sample type and refers to existing
//! locations; every string index (types, labels, functions, mappings) is in
//! the table; every location's functions and mapping exist.

use super::pprof::Profile;
use std::collections::HashSet;

/// Why `p` is not a usable profile, or `Ok`.
pub fn validate(p: &Profile) -> Result<(), String> {
    if p.string_table.first().map(String::as_str) != Some("") {
        return Err("no string table (or its first string is not empty)".into());
    }
    if p.sample_type.is_empty() {
        return Err("no sample types".into());
    }
    let n = p.string_table.len() as i64;
    let idx = |i: i64, what: &str| {
        if (0..n).contains(&i) {
            Ok(())
        } else {
            Err(format!("{what} refers to string {i}, past the table's {n}"))
        }
    };
    for t in p.sample_type.iter().chain(p.period_type.as_ref()) {
        idx(t.r#type, "a sample type")?;
        idx(t.unit, "a sample type's unit")?;
    }
    for f in &p.function {
        idx(f.name, "a function")?;
        idx(f.system_name, "a function")?;
        idx(f.filename, "a function")?;
    }
    for m in &p.mapping {
        idx(m.filename, "a mapping")?;
        idx(m.build_id, "a mapping")?;
    }
    let functions: HashSet<u64> = p.function.iter().map(|f| f.id).collect();
    let mappings: HashSet<u64> = p.mapping.iter().map(|m| m.id).collect();
    for l in &p.location {
        if l.mapping_id != 0 && !mappings.contains(&l.mapping_id) {
            return Err(format!("location {} refers to missing mapping {}", l.id, l.mapping_id));
        }
        if let Some(line) = l.line.iter().find(|line| !functions.contains(&line.function_id)) {
            return Err(format!("location {} refers to missing function {}", l.id, line.function_id));
        }
    }
    let locations: HashSet<u64> = p.location.iter().map(|l| l.id).collect();
    for s in &p.sample {
        if s.value.len() != p.sample_type.len() {
            return Err(format!("a sample has {} values for {} sample types", s.value.len(), p.sample_type.len()));
        }
        if let Some(id) = s.location_id.iter().find(|id| !locations.contains(id)) {
            return Err(format!("a sample refers to missing location {id}"));
        }
        for l in &s.label {
            idx(l.key, "a label")?;
            idx(l.str, "a label")?;
            idx(l.num_unit, "a label's unit")?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::validate;
    use crate::pprof::{Profile, Sample, ValueType};

    fn minimal() -> Profile {
        Profile {
            string_table: vec!["".into(), "cpu".into(), "nanoseconds".into()],
            sample_type: vec![ValueType { r#type: 1, unit: 2 }],
            sample: vec![Sample { value: vec![5], ..Sample::default() }],
            ..Profile::default()
        }
    }

    #[test]
    fn accepts_a_minimal_profile_and_names_what_is_wrong() {
        assert_eq!(validate(&minimal()), Ok(()));
        assert!(validate(&Profile::default()).unwrap_err().contains("string table"));
        let mut p = minimal();
        p.sample[0].value.push(1);
        assert!(validate(&p).unwrap_err().contains("2 values for 1 sample types"));
        let mut p = minimal();
        p.sample[0].location_id.push(3);
        assert!(validate(&p).unwrap_err().contains("missing location 3"));
        let mut p = minimal();
        p.sample_type[0].unit = 9;
        assert!(validate(&p).unwrap_err().contains("string 9"));
    }
}
