//! The new password of `authd admin set-password`: the first line of standard input
//! or of `--password-file`, its line ending removed and nothing else (spaces are a
//! password's own). Never an argument, and never typed at a terminal, which would
//! show it.

use std::{
    io::{BufRead, BufReader, IsTerminal as _},
    path::Path,
};

/// The most a line may hold: far above any password the server accepts (1024
/// bytes), low enough that an endless input is not read into memory.
const MAX_LINE_BYTES: u64 = 64 * 1024;

/// The new password: the first line of `file`, or of standard input when no file is
/// given. An error never quotes what was read.
pub(super) fn new_password(file: Option<&Path>) -> Result<String, String> {
    match file {
        Some(path) => {
            let from = format!("--password-file {}", path.display());
            let file = std::fs::File::open(path)
                .map_err(|e| format!("{from}: cannot read the file: {e}"))?;
            first_line(BufReader::new(file), &from)
        }
        None => {
            let stdin = std::io::stdin();
            if stdin.is_terminal() {
                return Err("the new password is read from standard input (a pipe or a \
                            redirected file) or from --password-file, never typed at a \
                            terminal, which would show it"
                    .into());
            }
            first_line(stdin.lock(), "standard input")
        }
    }
}

/// The first line of `reader` without its line ending (`\n` or `\r\n`).
fn first_line(reader: impl BufRead, from: &str) -> Result<String, String> {
    let mut line = Vec::new();
    reader
        .take(MAX_LINE_BYTES + 1)
        .read_until(b'\n', &mut line)
        .map_err(|e| format!("{from}: cannot read it: {e}"))?;
    if line.last() == Some(&b'\n') {
        line.pop();
        if line.last() == Some(&b'\r') {
            line.pop();
        }
    } else if line.len() as u64 > MAX_LINE_BYTES {
        return Err(format!(
            "{from}: the first line is longer than {MAX_LINE_BYTES} bytes"
        ));
    }
    if line.is_empty() {
        return Err(format!("{from}: no password: the first line is empty"));
    }
    String::from_utf8(line).map_err(|_| format!("{from}: the password is not valid UTF-8"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_password_is_the_first_line_without_its_ending() {
        let read = |text: &[u8]| first_line(text, "standard input");
        assert_eq!(read(b"s3cret pw\n").unwrap(), "s3cret pw");
        assert_eq!(read(b"s3cret pw\r\nsecond line\n").unwrap(), "s3cret pw");
        assert_eq!(read(b"s3cret pw").unwrap(), "s3cret pw");
        assert_eq!(read(b"  spaced  \n").unwrap(), "  spaced  ");
        for empty in [&b""[..], b"\n", b"\r\n"] {
            let why = read(empty).unwrap_err();
            assert!(why.contains("empty"), "{why}");
        }
        let why = read(b"s3cret\xff\n").unwrap_err();
        assert!(why.contains("UTF-8") && !why.contains("s3cret"), "{why}");
        let long = vec![b'x'; MAX_LINE_BYTES as usize + 1];
        assert!(read(&long).unwrap_err().contains("longer than"));
    }

    #[test]
    fn a_password_file_is_named_in_its_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pw");
        std::fs::write(&path, "s3cret pw\n").unwrap();
        assert_eq!(new_password(Some(&path)).unwrap(), "s3cret pw");
        let missing = new_password(Some(&dir.path().join("missing"))).unwrap_err();
        assert!(missing.starts_with("--password-file "), "{missing}");
        assert!(missing.contains("cannot read the file"), "{missing}");
    }
}
