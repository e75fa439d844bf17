//! The profiles a report or a diff reads: files and directories expanded,
//! every file read and checked, and the sample type they are compared on.
//!
//! Invariant: every error names the file it is about, in one line.

use super::ReportError;
use osprey_pprof::pprof::Profile;
use osprey_pprof::read_profile;
use std::path::{Path, PathBuf};

/// One profile file, read.
pub struct Input {
    /// The file.
    pub path: PathBuf,
    /// Its profile.
    pub profile: Profile,
}

/// The files `args` name (a directory: its `*.pb.gz`, sorted); none: every
/// profile in `./profiles`.
pub fn expand(args: &[PathBuf]) -> Result<Vec<PathBuf>, ReportError> {
    if args.is_empty() {
        return profiles_in(Path::new("profiles")).map_err(|e| ReportError::NoneGiven(Box::new(e)));
    }
    let mut out = Vec::new();
    for f in args {
        if f.is_dir() {
            out.extend(profiles_in(f)?);
        } else {
            out.push(f.clone());
        }
    }
    Ok(out)
}

/// Reads every file of `args` (see [`expand`]).
pub fn read_all(args: &[PathBuf]) -> Result<Vec<Input>, ReportError> {
    expand(args)?.into_iter().map(|path| Ok(Input { profile: read_profile(&path)?, path })).collect()
}

/// The profile files in `dir`, sorted.
fn profiles_in(dir: &Path) -> Result<Vec<PathBuf>, ReportError> {
    let rd = std::fs::read_dir(dir).map_err(|e| ReportError::ReadDir(dir.to_path_buf(), e))?;
    let mut v: Vec<PathBuf> = rd
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| !n.starts_with('.') && n.ends_with(".pb.gz"))
        })
        .collect();
    v.sort();
    if v.is_empty() {
        return Err(ReportError::NoProfileFiles(dir.to_path_buf()));
    }
    Ok(v)
}

/// `type/unit` of each of `p`'s sample types.
pub fn type_names(p: &Profile) -> Vec<String> {
    p.sample_type.iter().map(|t| format!("{}/{}", p.string(t.r#type), p.string(t.unit))).collect()
}

/// The (type, unit) compared: `asked` (a type name or an index into the
/// first file's types), by default `cpu` when the first file has it, else
/// its last type. Every input must have it with the same unit; the error
/// names the first file that does not.
pub fn sample_type(inputs: &[Input], asked: Option<&str>) -> Result<(String, String), ReportError> {
    let first = inputs.first().ok_or(ReportError::Profile(osprey_pprof::Error::NoProfiles))?;
    let p = &first.profile;
    let names: Vec<&str> = p.sample_type.iter().map(|t| p.string(t.r#type)).collect();
    let pick = match asked {
        None => names.iter().position(|t| *t == "cpu").unwrap_or(names.len() - 1),
        Some(s) => match s.parse::<usize>() {
            Ok(i) if i < names.len() => i,
            _ => names.iter().position(|t| *t == s).ok_or_else(|| ReportError::UnknownType {
                path: first.path.clone(),
                asked: s.to_string(),
                have: type_names(p),
            })?,
        },
    };
    let t = &p.sample_type[pick];
    let chosen = (p.string(t.r#type).to_string(), p.string(t.unit).to_string());
    for i in inputs {
        let q = &i.profile;
        if !q.sample_type.iter().any(|t| q.string(t.r#type) == chosen.0 && q.string(t.unit) == chosen.1) {
            return Err(ReportError::MissingType {
                path: i.path.clone(),
                want: format!("{}/{}", chosen.0, chosen.1),
                have: type_names(q),
                like: first.path.clone(),
            });
        }
    }
    Ok(chosen)
}
