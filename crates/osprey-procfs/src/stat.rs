//! `/proc/PID/stat` and `/proc/PID/task/TID/stat`:
//! `pid (comm) state ppid pgrp ...`, fields numbered as in proc(5).
//!
//! Invariants: the command name is everything between the first `(` and the
//! *last* `)` (it may hold spaces and parentheses, and need not be UTF-8);
//! the state is the character after that `)` and its space (field 3), and
//! every later field is one whitespace-separated token.

use std::io;

/// One parsed `stat` text, borrowing from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stat<'a> {
    /// Field 1: the process (or thread) id.
    pub pid: i32,
    /// Field 2: the command name, without its parentheses.
    pub comm: &'a [u8],
    /// Field 3: the state (`R` running or runnable, `S` sleeping, `Z` zombie, ...).
    pub state: u8,
    /// Field 1 as text.
    pid_text: &'a [u8],
    /// Fields 3 (the state) onwards, separated by whitespace.
    fields: &'a [u8],
}

impl<'a> Stat<'a> {
    /// Parses a `stat` text. `None` if the pid, the parenthesised name or
    /// the state is missing or malformed; later fields are checked only
    /// when read.
    pub fn parse(text: &'a [u8]) -> Option<Stat<'a>> {
        let open = text.iter().position(|&b| b == b'(')?;
        let close = text.iter().rposition(|&b| b == b')')?;
        let comm = text.get(open + 1..close)?;
        let pid_text = text[..open].trim_ascii();
        let pid = std::str::from_utf8(pid_text).ok()?.parse().ok()?;
        let after = text.get(close + 1..)?;
        let [b' ', state, rest @ ..] = after else { return None };
        if state.is_ascii_whitespace() || !(rest.is_empty() || rest[0].is_ascii_whitespace()) {
            return None;
        }
        Some(Stat { pid, comm, state: *state, pid_text, fields: &after[1..] })
    }

    /// Field `n` as text, numbered as in proc(5) (1 = pid, 2 = comm without
    /// its parentheses, 3 = state, 4 = ppid, ...). `None` past the last field
    /// or if it is not UTF-8.
    pub fn field(&self, n: usize) -> Option<&'a str> {
        let token = match n {
            0 => return None,
            1 => self.pid_text,
            2 => self.comm,
            _ => self.fields.split(u8::is_ascii_whitespace).filter(|t| !t.is_empty()).nth(n - 3)?,
        };
        std::str::from_utf8(token).ok()
    }

    /// Field `n` (numbered as in proc(5), from 4) as a number.
    pub fn num<T: std::str::FromStr>(&self, n: usize) -> Option<T> {
        if n < 4 {
            return None;
        }
        self.field(n)?.parse().ok()
    }

    /// Field 4: the parent's pid.
    pub fn ppid(&self) -> Option<i32> {
        self.num(4)
    }

    /// Field 5: the process group id.
    pub fn pgrp(&self) -> Option<i32> {
        self.num(5)
    }

    /// Field 14: user-mode CPU time, in clock ticks.
    pub fn utime(&self) -> Option<u64> {
        self.num(14)
    }

    /// Field 15: kernel-mode CPU time, in clock ticks.
    pub fn stime(&self) -> Option<u64> {
        self.num(15)
    }

    /// Field 16: user-mode CPU time of waited-for children, in clock ticks.
    pub fn cutime(&self) -> Option<u64> {
        self.num(16)
    }

    /// Field 17: kernel-mode CPU time of waited-for children, in clock ticks.
    pub fn cstime(&self) -> Option<u64> {
        self.num(17)
    }

    /// Field 20: number of threads in the process.
    pub fn num_threads(&self) -> Option<u64> {
        self.num(20)
    }

    /// Field 22: when the process started, in clock ticks since boot (with
    /// the pid, it names one process even once the pid is reused).
    pub fn starttime(&self) -> Option<u64> {
        self.num(22)
    }

    /// Field 26: address above which program text can run.
    pub fn startcode(&self) -> Option<u64> {
        self.num(26)
    }

    /// Field 28: address of the start (bottom) of the main thread's stack.
    pub fn startstack(&self) -> Option<u64> {
        self.num(28)
    }

    /// Field 39: the CPU the task last ran on.
    pub fn processor(&self) -> Option<u32> {
        self.num(39)
    }
}

/// The contents of `/proc/<pid>/stat` (`pid <= 0`: this process).
pub fn read(pid: i32) -> io::Result<Vec<u8>> {
    crate::read_file(&crate::proc_dir(pid).join("stat"))
}

/// The contents of `/proc/<pid>/task/<tid>/stat` (`pid <= 0`: this process):
/// one thread's own CPU times, where the process's `stat` sums its threads'.
pub fn read_task(pid: i32, tid: i32) -> io::Result<Vec<u8>> {
    crate::read_file(&crate::proc_dir(pid).join(format!("task/{tid}/stat")))
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINE: &[u8] = b"4242 (my prog) S 1 4242 4242 0 -1 4194560 100 0 0 0 7 3 2 1 20 0 4 0 123456 1000 200 \
        18446744073709551615 94000 95000 140000 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0\n";

    #[test]
    fn fields() {
        let s = Stat::parse(LINE).unwrap();
        assert_eq!((s.pid, s.comm, s.state), (4242, &b"my prog"[..], b'S'));
        assert_eq!((s.ppid(), s.pgrp()), (Some(1), Some(4242)));
        assert_eq!((s.utime(), s.stime(), s.cutime(), s.cstime()), (Some(7), Some(3), Some(2), Some(1)));
        assert_eq!((s.num_threads(), s.starttime()), (Some(4), Some(123456)));
        assert_eq!((s.startcode(), s.startstack(), s.processor()), (Some(94000), Some(140000), Some(1)));
        assert_eq!(
            (s.field(2), s.field(3), s.field(4), s.field(9)),
            (Some("my prog"), Some("S"), Some("1"), Some("4194560"))
        );
        assert_eq!(s.field(25), Some("18446744073709551615"));
        assert_eq!((s.field(1), s.field(0), s.field(44), s.field(45)), (Some("4242"), None, Some("0"), None));
        assert_eq!(s.num::<u64>(3), None);
    }

    #[test]
    fn comm_with_parens_and_spaces() {
        let s = Stat::parse(b"123 (a) b) c) R 1 2").unwrap();
        assert_eq!((s.pid, s.comm, s.state, s.ppid(), s.pgrp()), (123, &b"a) b) c"[..], b'R', Some(1), Some(2)));
        let s = Stat::parse(b"7 ((sd-pam)) Z 6").unwrap();
        assert_eq!((s.comm, s.state, s.ppid()), (&b"(sd-pam)"[..], b'Z', Some(6)));
        let s = Stat::parse(b"7 () R").unwrap();
        assert_eq!((s.comm, s.state, s.ppid()), (&b""[..], b'R', None));
        let s = Stat::parse(b"8 (\xff x) S 1").unwrap();
        assert_eq!((s.comm, s.field(2), s.ppid()), (&b"\xff x"[..], None, Some(1)));
    }

    #[test]
    fn garbage_is_none() {
        for text in [
            &b""[..],
            b"\n",
            b"123",
            b"123 (abc",
            b"123 abc) R 1",
            b"123 (abc)",
            b"123 (abc) ",
            b"123 (abc)R 1",
            b"123 (abc) RS 1",
            b"x (abc) R 1",
            b"-",
            b")(",
            b"1 ) (",
        ] {
            assert_eq!(Stat::parse(text), None, "{:?}", String::from_utf8_lossy(text));
        }
        let s = Stat::parse(b"1 (a) R 1 x").unwrap();
        assert_eq!((s.pgrp(), s.utime()), (None, None));
    }

    #[test]
    fn reads_own_stat() {
        let buf = read(0).unwrap();
        let s = Stat::parse(&buf).unwrap();
        assert_eq!(s.pid as u32, std::process::id());
        assert!(s.num_threads().unwrap() >= 1 && s.starttime().is_some());
        let t = read_task(0, s.pid).unwrap();
        assert_eq!(Stat::parse(&t).unwrap().starttime(), s.starttime());
    }
}
