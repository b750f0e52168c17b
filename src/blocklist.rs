//! The password blocklist: refuses, before any hashing, a new password that is one of
//! the most common ones or that is the username.
//!
//! It owns two sets of folded passwords (NFKC, then Unicode lowercase, see [`fold`]):
//! the bundled list (`data/common-passwords.txt.gz`, built into an `fst::Set` by
//! `build.rs` and searched in place in the binary's read-only data, so it costs no
//! heap and no start-up time), unless `AUTHD_PASSWORD_BLOCKLIST=off`; and an
//! organization's own list from `AUTHD_PASSWORD_BLOCKLIST_FILE`, read once at start
//! into an `fst::Set` in memory. [`Blocklist::check`] is the one rule, for Register
//! and for any later RPC that sets a password.
//!
//! It must not see a password in any other form than [`Password`], nor put one in a
//! log line, a metric or an error: refusals are counted by reason only.

use crate::{
    credentials::{Password, Username},
    error::{Error, FieldViolation},
    metrics::Metrics,
};
use anyhow::Context as _;
use fst::Set;
use prometheus::IntCounter;
use std::{io::Read as _, path::Path};
use unicode_normalization::{IsNormalized, UnicodeNormalization as _, is_nfkc_quick};

/// The bundled set, as `build.rs` wrote it.
static BUNDLED: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/common-passwords.fst"));

/// The largest organization file authd reads: lists of a few million passwords fit
/// well under it; anything larger is more likely a wrong path than a list.
pub(crate) const MAX_FILE_BYTES: u64 = 64 * 1024 * 1024;

/// Why a password was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// On the bundled list or the organization's.
    Common,
    /// The username itself, in any case or Unicode form.
    Username,
}

impl Refusal {
    /// What the client is told, as the description of a field violation.
    pub fn description(self) -> &'static str {
        match self {
            Refusal::Common => "is too common",
            Refusal::Username => "must not be the username",
        }
    }

    /// The `reason` label of `authd_password_blocklist_refusals_total`.
    fn label(self) -> &'static str {
        match self {
            Refusal::Common => "common",
            Refusal::Username => "username",
        }
    }
}

/// How a password and a list entry are compared: NFKC (as `Password::parse`
/// normalizes), then Unicode lowercase. `build.rs` folds the bundled list the same way.
pub(crate) fn fold(s: &str) -> String {
    // A `Password` is NFKC already, and so are most list entries: the quick check
    // answers Yes only for text that NFKC leaves as it is, and saves a second pass.
    match is_nfkc_quick(s.chars()) {
        IsNormalized::Yes => s.to_lowercase(),
        IsNormalized::No | IsNormalized::Maybe => s.nfkc().collect::<String>().to_lowercase(),
    }
}

pub(crate) struct Blocklist {
    bundled: Option<Set<&'static [u8]>>,
    organization: Option<Set<Vec<u8>>>,
    /// Indexed as [`Refusal`]: common, username.
    refusals: [IntCounter; 2],
}

impl Blocklist {
    /// Refuses a new password (in the request field `field`) that the list refuses,
    /// as INVALID_ARGUMENT naming the field: called by every RPC that sets one,
    /// before any store or hashing work.
    pub fn check_new_password(
        &self,
        field: &'static str,
        username: &Username,
        password: &Password,
    ) -> Result<(), Error> {
        self.check(password, username).map_err(|refusal| {
            Error::InvalidArgument(vec![FieldViolation {
                field,
                description: refusal.description().into(),
            }])
        })
    }

    /// The bundled list when `bundled` is set, plus the list in `file`, if any. An
    /// unreadable, oversized or non-UTF-8 file is an error naming the option and path.
    pub fn new(bundled: bool, file: Option<&Path>, metrics: &Metrics) -> anyhow::Result<Self> {
        let bundled = if bundled {
            Some(Set::new(BUNDLED).context("the bundled password blocklist is corrupt")?)
        } else {
            None
        };
        let organization = match file {
            Some(path) => Some(read_list(path, MAX_FILE_BYTES).map_err(|why| {
                anyhow::anyhow!("--password-blocklist-file {}: {why}", path.display())
            })?),
            None => None,
        };
        tracing::info!(
            bundled = if bundled.is_some() { "on" } else { "off" },
            bundled_entries = bundled.as_ref().map(Set::len),
            file = file.map(|path| path.display().to_string()),
            file_entries = organization.as_ref().map(Set::len),
            "password blocklist ready"
        );
        let refusals = &metrics.blocklist.refusals;
        Ok(Self {
            bundled,
            organization,
            refusals: [Refusal::Common, Refusal::Username]
                .map(|r| refusals.with_label_values(&[r.label()])),
        })
    }

    /// Distinct folded entries of the bundled list, if it is on.
    #[cfg(test)]
    pub fn bundled_len(&self) -> Option<usize> {
        self.bundled.as_ref().map(Set::len)
    }

    /// Distinct folded entries of the organization's list, if one was given.
    #[cfg(test)]
    pub fn organization_len(&self) -> Option<usize> {
        self.organization.as_ref().map(Set::len)
    }

    /// Refuses `password` when it is the username or on a list, compared after
    /// folding both (see [`fold`]); each refusal is counted by its reason. Costs a
    /// lowercased copy of the password and one lookup per list: microseconds.
    pub fn check(&self, password: &Password, username: &Username) -> Result<(), Refusal> {
        // A `Password` holds a `String`: its bytes are UTF-8, so this borrows.
        let folded = fold(&String::from_utf8_lossy(password.as_bytes()));
        // Usernames are lowercase ASCII already, which folding leaves as it is.
        let refusal = if folded == username.as_str() {
            Refusal::Username
        } else if self.contains(&folded) {
            Refusal::Common
        } else {
            return Ok(());
        };
        self.refusals[refusal as usize].inc();
        Err(refusal)
    }

    fn contains(&self, folded: &str) -> bool {
        self.bundled
            .as_ref()
            .is_some_and(|set| set.contains(folded))
            || self
                .organization
                .as_ref()
                .is_some_and(|set| set.contains(folded))
    }
}

/// Reads an organization's list of at most `max_bytes`: one password per line, UTF-8
/// (a leading byte-order mark, a trailing `\r` and empty lines ignored), each entry
/// folded.
///
/// While reading, memory peaks near the text, its folded copy, 8 bytes per entry to
/// sort them and the set being built; what remains is the compact set.
fn read_list(path: &Path, max_bytes: u64) -> Result<Set<Vec<u8>>, String> {
    let file = std::fs::File::open(path).map_err(|e| format!("cannot read the file: {e}"))?;
    let too_large = || format!("larger than {}", bytes_in_words(max_bytes));
    if file.metadata().is_ok_and(|m| m.len() > max_bytes) {
        return Err(too_large());
    }
    // Bounded here too: a FIFO or a file still growing has no meaningful length.
    let mut bytes = Vec::new();
    file.take(max_bytes + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read the file: {e}"))?;
    if bytes.len() as u64 > max_bytes {
        return Err(too_large());
    }
    let text = String::from_utf8(bytes).map_err(|e| {
        let line = 1 + e.as_bytes()[..e.utf8_error().valid_up_to()]
            .iter()
            .filter(|&&b| b == b'\n')
            .count();
        format!("not valid UTF-8 (line {line})")
    })?;
    let (folded, mut spans) = fold_lines(text.strip_prefix('\u{FEFF}').unwrap_or(&text))?;
    drop(text);
    let entry = |&(start, len): &(u32, u32)| &folded.as_bytes()[start as usize..][..len as usize];
    spans.sort_unstable_by(|a, b| entry(a).cmp(entry(b)));
    spans.dedup_by(|a, b| entry(a) == entry(b));
    let built = |e: fst::Error| format!("cannot build the set: {e}");
    let set = Set::from_iter(spans.iter().map(entry)).map_err(built)?;
    // The builder's buffer grew by doubling: keep only what the set uses.
    let mut bytes = set.into_fst().into_inner();
    bytes.shrink_to_fit();
    Set::new(bytes).map_err(built)
}

/// Every non-empty line of `text` (a trailing `\r` removed) folded into one buffer,
/// each as an (offset, length) span of it: 8 bytes per entry beside the text itself.
fn fold_lines(text: &str) -> Result<(String, Vec<(u32, u32)>), String> {
    let mut folded = String::with_capacity(text.len());
    let mut spans = Vec::new();
    let overflow = || "too large once normalized".to_owned();
    for line in text.split('\n') {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line.is_empty() {
            continue;
        }
        let start = folded.len();
        folded.push_str(&fold(line));
        let start_u32 = u32::try_from(start).map_err(|_| overflow())?;
        let len = u32::try_from(folded.len() - start).map_err(|_| overflow())?;
        spans.push((start_u32, len));
    }
    Ok((folded, spans))
}

/// `64 MiB` for a whole number of MiB, else the bytes.
fn bytes_in_words(bytes: u64) -> String {
    if bytes > 0 && bytes.is_multiple_of(1 << 20) {
        format!("{} MiB", bytes >> 20)
    } else {
        format!("{bytes} bytes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;

    fn blocklist(bundled: bool, file: Option<&Path>) -> (Blocklist, Metrics) {
        let metrics = Metrics::new();
        (Blocklist::new(bundled, file, &metrics).unwrap(), metrics)
    }

    fn password(s: &str) -> Password {
        Password::parse(s).unwrap()
    }

    fn user(s: &str) -> Username {
        Username::parse(s).unwrap()
    }

    fn file_with(content: &[u8]) -> tempfile::NamedTempFile {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        file.write_all(content).unwrap();
        file
    }

    /// The committed list, as `data/README.md` describes it.
    fn committed_list() -> Vec<u8> {
        let gz = std::fs::read(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/data/common-passwords.txt.gz"
        ))
        .unwrap();
        let mut text = Vec::new();
        flate2::read::GzDecoder::new(&gz[..])
            .read_to_end(&mut text)
            .unwrap();
        text
    }

    #[test]
    fn the_committed_list_is_the_one_its_readme_names() {
        use sha2::{Digest as _, Sha256};
        let list = committed_list();
        assert_eq!(list.iter().filter(|&&b| b == b'\n').count(), 100_000);
        let digest = hex::encode(Sha256::digest(&list));
        let readme =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/data/README.md"))
                .unwrap();
        assert!(readme.contains(&digest), "data/README.md lacks {digest}");
    }

    #[test]
    fn the_bundled_set_is_the_committed_list_folded_as_at_run_time() {
        let set = Set::new(BUNDLED).unwrap();
        set.as_fst().verify().expect("the checksum matches");
        let text = String::from_utf8(committed_list()).unwrap();
        let folded: std::collections::BTreeSet<String> = text.lines().map(fold).collect();
        assert_eq!(set.len(), folded.len());
        for entry in &folded {
            assert!(set.contains(entry), "{entry:?} is missing");
        }
    }

    #[test]
    fn common_passwords_are_refused_in_any_case_and_unicode_form() {
        let (list, metrics) = blocklist(true, None);
        let alice = user("alice");
        for common in [
            "password123",
            "qwertyuiop",
            "PassWord123",
            "QWERTYUIOP",
            // Full-width letters and digits: NFKC makes them ASCII.
            "ｐａｓｓｗｏｒｄ１２３",
            "Ｐａｓｓｗｏｒｄ１２３",
        ] {
            assert_eq!(
                list.check(&password(common), &alice),
                Err(Refusal::Common),
                "{common:?}"
            );
        }
        assert!(
            metrics
                .render()
                .contains("authd_password_blocklist_refusals_total{reason=\"common\"} 6")
        );
        for fine in ["violet tractor at dawn", "password123 but longer, really"] {
            assert_eq!(list.check(&password(fine), &alice), Ok(()), "{fine:?}");
        }
    }

    #[test]
    fn the_username_is_refused_in_any_case_and_unicode_form() {
        // The username rule holds with no list at all.
        let (list, metrics) = blocklist(false, None);
        let name = user("Zanzibar-42x");
        for same in ["zanzibar-42x", "ZANZIBAR-42X", "ＺａｎＺｉｂａｒ－４２ｘ"] {
            assert_eq!(
                list.check(&password(same), &name),
                Err(Refusal::Username),
                "{same:?}"
            );
        }
        assert_eq!(list.check(&password("zanzibar-42x!"), &name), Ok(()));
        assert!(
            metrics
                .render()
                .contains("authd_password_blocklist_refusals_total{reason=\"username\"} 3")
        );
        assert_eq!(list.bundled_len(), None);
        assert_eq!(list.check(&password("password123"), &name), Ok(()));
    }

    #[test]
    fn an_organization_file_is_folded_deduplicated_and_added() {
        let file = file_with(
            "\u{FEFF}Acme-Spring-2024\r\n\nacme-spring-2024\nＡＣＭＥ ｗｉｎｔｅｒ\n  \nlast line, no newline"
                .as_bytes(),
        );
        let (list, _) = blocklist(false, Some(file.path()));
        // Three distinct entries and the line of two spaces (kept: passwords are never trimmed).
        assert_eq!(list.organization_len(), Some(4));
        let bob = user("bob");
        for refused in [
            "acme-spring-2024",
            "ACME-SPRING-2024",
            "acme winter",
            "Last Line, No Newline",
        ] {
            assert_eq!(
                list.check(&password(refused), &bob),
                Err(Refusal::Common),
                "{refused:?}"
            );
        }
        // The bundled list is off, the file's neighbours pass.
        for fine in ["password123", "acme-spring-2025", "acme winter "] {
            assert_eq!(list.check(&password(fine), &bob), Ok(()), "{fine:?}");
        }
        let (both, _) = blocklist(true, Some(file.path()));
        assert_eq!(
            both.check(&password("password123"), &bob),
            Err(Refusal::Common)
        );
        assert_eq!(
            both.check(&password("acme winter"), &bob),
            Err(Refusal::Common)
        );
    }

    #[test]
    fn a_bad_organization_file_is_refused_naming_the_option_and_the_path() {
        let metrics = Metrics::new();
        let error = |path: &Path| {
            let err = Blocklist::new(true, Some(path), &metrics).err().unwrap();
            let text = format!("{err:#}");
            let prefix = format!("--password-blocklist-file {}: ", path.display());
            assert!(text.starts_with(&prefix), "{text}");
            assert!(!text.contains('\n'), "{text}");
            text[prefix.len()..].to_owned()
        };
        let bad = file_with(b"fine\nalso fine\nnot \xff fine\n");
        assert_eq!(error(bad.path()), "not valid UTF-8 (line 3)");
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.txt");
        assert!(error(&missing).starts_with("cannot read the file: "));
        assert!(error(dir.path()).starts_with("cannot read the file: "));
        // Sparse: refused by its length, never read.
        let huge = tempfile::NamedTempFile::new().unwrap();
        huge.as_file().set_len(MAX_FILE_BYTES + 1).unwrap();
        assert_eq!(error(huge.path()), "larger than 64 MiB");
    }

    #[test]
    fn the_size_limit_admits_a_file_of_exactly_its_size() {
        let file = file_with(b"0123456789\n");
        assert_eq!(read_list(file.path(), 11).unwrap().len(), 1);
        assert_eq!(
            read_list(file.path(), 10).unwrap_err(),
            "larger than 10 bytes"
        );
    }

    #[test]
    fn an_empty_organization_file_is_an_empty_list() {
        let file = file_with(b"\n\r\n");
        let (list, _) = blocklist(false, Some(file.path()));
        assert_eq!(list.organization_len(), Some(0));
        assert_eq!(
            list.check(&password("anything at all"), &user("bob")),
            Ok(())
        );
    }

    /// The cost of one check, for the documentation. Run in a release build:
    /// `cargo test --release --lib blocklist -- --ignored --nocapture`.
    #[test]
    #[ignore = "a measurement, not a test"]
    fn measure_the_cost_of_a_check() {
        use std::{hint::black_box, time::Instant};
        let (list, _) = blocklist(true, None);
        let bob = user("bob");
        for candidate in [
            "password123",
            "ＰＡＳＳＷＯＲＤ１２３",
            "violet tractor at dawn",
            &"long passphrase ".repeat(16),
        ] {
            let p = password(candidate);
            let rounds = 200_000u32;
            // Real time: what an ignored benchmark prints.
            let start = Instant::now();
            for _ in 0..rounds {
                let _ = black_box(list.check(black_box(&p), &bob));
            }
            let each = start.elapsed() / rounds;
            println!("{:>4} bytes: {each:?} per check", p.as_bytes().len());
        }
        println!(
            "bundled set: {} bytes, {} entries",
            BUNDLED.len(),
            list.bundled_len().unwrap()
        );
        // An organization's list of your own: BLOCKLIST_MEASURE_FILE=path.
        if let Some(path) = std::env::var_os("BLOCKLIST_MEASURE_FILE") {
            let rss = |field: &str| {
                std::fs::read_to_string("/proc/self/status")
                    .ok()?
                    .lines()
                    .find_map(|l| {
                        l.strip_prefix(field)?
                            .trim()
                            .strip_suffix(" kB")?
                            .parse::<u64>()
                            .ok()
                    })
            };
            let before = rss("VmRSS:");
            // Real time: what an ignored benchmark prints.
            let start = Instant::now();
            let set = read_list(Path::new(&path), MAX_FILE_BYTES).unwrap();
            let took = start.elapsed();
            println!(
                "file: {} entries, set {} bytes, read in {took:?}; RSS before {before:?} kB, peak {:?} kB, after {:?} kB",
                set.len(),
                set.as_fst().as_bytes().len(),
                rss("VmHWM:"),
                rss("VmRSS:"),
            );
        }
    }
}
