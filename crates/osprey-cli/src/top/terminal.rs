//! The terminal side of `osprey top`: keys read one by one (no line
//! buffering, no echo) and the screen redrawn with ANSI sequences on the
//! alternate screen. [`Raw`] puts the terminal back as it found it when
//! dropped: on `q`, Ctrl-C (which still raises SIGINT: `ISIG` is kept),
//! an error, or a panic unwinding through it.

use std::io::Write;
use std::mem::MaybeUninit;
use std::os::fd::RawFd;
use std::time::Duration;

/// A key that means something to `top`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Key {
    Quit,
    SortOwn,
    SortTotal,
    NextThread,
    PrevThread,
    AllThreads,
}

/// The terminal in key-at-a-time mode until dropped.
pub struct Raw {
    fd: RawFd,
    saved: libc::termios,
}

impl Raw {
    /// Switches `fd` (a terminal) to key-at-a-time mode and the alternate
    /// screen, cursor hidden.
    pub fn enter(fd: RawFd) -> std::io::Result<Raw> {
        let mut t = MaybeUninit::<libc::termios>::uninit();
        // SAFETY: tcgetattr fills `t` on success.
        if unsafe { libc::tcgetattr(fd, t.as_mut_ptr()) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: filled above.
        let saved = unsafe { t.assume_init() };
        let mut raw = saved;
        raw.c_lflag &= !(libc::ICANON | libc::ECHO);
        raw.c_cc[libc::VMIN] = 0;
        raw.c_cc[libc::VTIME] = 0;
        // SAFETY: a termios derived from the terminal's own.
        if unsafe { libc::tcsetattr(fd, libc::TCSANOW, &raw) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let guard = Raw { fd, saved };
        let _ = std::io::stdout().write_all(b"\x1b[?1049h\x1b[?25l");
        let _ = std::io::stdout().flush();
        Ok(guard)
    }

    /// Waits up to `timeout` for a key; unknown keys are skipped.
    pub fn key(&self, timeout: Duration) -> Option<Key> {
        let mut p = libc::pollfd { fd: self.fd, events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd.
        if unsafe { libc::poll(&mut p, 1, timeout.as_millis().min(i32::MAX as u128) as i32) } <= 0 {
            return None;
        }
        let mut buf = [0u8; 8];
        // SAFETY: reading into a local buffer of that size.
        let n = unsafe { libc::read(self.fd, buf.as_mut_ptr().cast(), buf.len()) };
        parse_key(&buf[..usize::try_from(n).ok()?])
    }

    /// Draws `lines` from the top left, each clipped to the terminal's width
    /// and the rest of the screen cleared.
    pub fn draw(&self, lines: &[String]) {
        let (_, cols) = size(self.fd);
        let mut out = String::from("\x1b[H");
        for l in lines {
            out.extend(l.chars().take(cols));
            out.push_str("\x1b[K\r\n");
        }
        out.push_str("\x1b[J");
        let mut o = std::io::stdout().lock();
        let _ = o.write_all(out.as_bytes());
        let _ = o.flush();
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        let _ = std::io::stdout().write_all(b"\x1b[?25h\x1b[?1049l");
        let _ = std::io::stdout().flush();
        // SAFETY: the settings read at `enter`.
        unsafe { libc::tcsetattr(self.fd, libc::TCSANOW, &self.saved) };
    }
}

/// The key of one read: a letter, Tab, or an arrow's escape sequence.
fn parse_key(b: &[u8]) -> Option<Key> {
    match b {
        [b'q' | b'Q', ..] | [0x1b] => Some(Key::Quit),
        [b'o', ..] => Some(Key::SortOwn),
        [b't', ..] => Some(Key::SortTotal),
        [b'\t', ..] | [b'n', ..] | [0x1b, b'[', b'C', ..] => Some(Key::NextThread),
        [b'p', ..] | [0x1b, b'[', b'Z', ..] | [0x1b, b'[', b'D', ..] => Some(Key::PrevThread),
        [b'a', ..] => Some(Key::AllThreads),
        _ => None,
    }
}

/// Rows and columns of the terminal on `fd` (24x80 if unknown).
pub fn size(fd: RawFd) -> (usize, usize) {
    let mut w = MaybeUninit::<libc::winsize>::zeroed();
    // SAFETY: TIOCGWINSZ fills a winsize.
    let ok = unsafe { libc::ioctl(fd, libc::TIOCGWINSZ, w.as_mut_ptr()) } == 0;
    // SAFETY: zeroed or filled.
    let w = unsafe { w.assume_init() };
    if !ok || w.ws_row == 0 || w.ws_col == 0 {
        return (24, 80);
    }
    (w.ws_row as usize, w.ws_col as usize)
}

/// `fd` is a terminal.
pub fn is_tty(fd: RawFd) -> bool {
    // SAFETY: isatty has no preconditions.
    unsafe { libc::isatty(fd) == 1 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_arrows() {
        assert_eq!(parse_key(b"q"), Some(Key::Quit));
        assert_eq!(parse_key(b"\x1b"), Some(Key::Quit));
        assert_eq!(parse_key(b"\x1b[C"), Some(Key::NextThread));
        assert_eq!(parse_key(b"\x1b[D"), Some(Key::PrevThread));
        assert_eq!(parse_key(b"t"), Some(Key::SortTotal));
        assert_eq!(parse_key(b"x"), None);
    }
}
