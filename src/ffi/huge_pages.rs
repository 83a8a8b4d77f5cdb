//! Asks Linux, once per weight, to back an op's code in 2 MiB pages
//! (`madvise(MADV_COLLAPSE)`). A GEMV walks one output block's tile rows a
//! whole code row apart, one 4 KiB page per tile row: at 17408 inputs that
//! is 1088 pages per block, and on a Xeon with AVX-512 FP16 the batch-1
//! GEMV ran 8-10% faster with its code in huge pages (docs/PERFORMANCE.md).
//!
//! Anonymous memory takes them: llama.cpp's buffers under `--load-mode
//! none` and test-backend-ops' tensors. For a mapped GGUF (llama.cpp's
//! default) the kernel refuses the request (EINVAL on ext4 here); its pages
//! are whatever the page cache holds, on Linux 6.18 mostly 2 MiB already.
//! Collapsing copies the weight once, on its first call. The contents
//! never change. `ESCHA_CPU_HUGE_PAGES=0` turns it off.

use std::collections::BTreeSet;
use std::sync::{Mutex, OnceLock};

/// The huge page size collapsed to (x86-64 and arm64 with 4 KiB pages).
const HUGE: usize = 2 << 20;

/// What one request did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Advice {
    /// The kernel now backs the range's whole 2 MiB pages with huge pages.
    Collapsed,
    /// The kernel refused (its errno): a file mapping, THP off, a kernel
    /// before 6.1.
    Refused(i32),
    /// No whole 2 MiB page lies inside the range.
    TooSmall,
    /// Not Linux, or `ESCHA_CPU_HUGE_PAGES=0`.
    Off,
}

/// The whole huge pages inside `start..start + len`, as (address, length).
fn interior(start: usize, len: usize) -> Option<(usize, usize)> {
    let lo = start.checked_add(HUGE - 1)? & !(HUGE - 1);
    let hi = start.checked_add(len)? & !(HUGE - 1);
    (hi > lo).then_some((lo, hi - lo))
}

fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| cfg!(target_os = "linux") && std::env::var("ESCHA_CPU_HUGE_PAGES").map_or(true, |v| v.trim() != "0"))
}

/// The first time `bytes` (by its address) is seen: asks for huge pages
/// under it and says what came of it; `None` on every later call.
pub fn advise_once(bytes: &[u8]) -> Option<Advice> {
    static SEEN: Mutex<BTreeSet<usize>> = Mutex::new(BTreeSet::new());
    if !SEEN.lock().unwrap_or_else(|e| e.into_inner()).insert(bytes.as_ptr() as usize) {
        return None;
    }
    Some(if enabled() { advise(bytes) } else { Advice::Off })
}

/// Asks for huge pages under `bytes` now.
pub fn advise(bytes: &[u8]) -> Advice {
    let Some((lo, len)) = interior(bytes.as_ptr() as usize, bytes.len()) else {
        return Advice::TooSmall;
    };
    collapse(lo, len)
}

#[cfg(target_os = "linux")]
fn collapse(lo: usize, len: usize) -> Advice {
    extern "C" {
        fn madvise(addr: *mut core::ffi::c_void, len: usize, advice: i32) -> i32;
    }
    const MADV_COLLAPSE: i32 = 25;
    // SAFETY: `lo..lo + len` lies inside a live slice (`interior`), and
    // MADV_COLLAPSE only changes which physical pages hold it, never its
    // contents or its mapping's protection: readers see the same bytes.
    let rc = unsafe { madvise(lo as *mut core::ffi::c_void, len, MADV_COLLAPSE) };
    if rc == 0 {
        Advice::Collapsed
    } else {
        Advice::Refused(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    }
}

#[cfg(not(target_os = "linux"))]
fn collapse(_lo: usize, _len: usize) -> Advice {
    Advice::Off
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interior_is_the_whole_huge_pages_inside() {
        assert_eq!(interior(HUGE, 2 * HUGE), Some((HUGE, 2 * HUGE)));
        assert_eq!(interior(HUGE + 1, 2 * HUGE), Some((2 * HUGE, HUGE)));
        assert_eq!(interior(HUGE - 1, HUGE + 1), Some((HUGE, HUGE)));
        assert_eq!(interior(HUGE + 1, HUGE), None);
        assert_eq!(interior(usize::MAX - 10, 100), None);
    }

    /// Huge pages (kB) of the mapping that holds `addr` (`/proc/self/smaps`).
    #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
    fn huge_kb_at(addr: usize) -> u64 {
        let s = std::fs::read_to_string("/proc/self/smaps").unwrap_or_default();
        let mut inside = false;
        for line in s.lines() {
            let range = line.split_whitespace().next().and_then(|r| r.split_once('-'));
            if let Some((a, b)) = range.and_then(|(a, b)| Some((usize::from_str_radix(a, 16).ok()?, usize::from_str_radix(b, 16).ok()?))) {
                inside = (a..b).contains(&addr);
            } else if let Some(v) = line.strip_prefix("AnonHugePages:").filter(|_| inside) {
                return v.trim().trim_end_matches("kB").trim().parse().unwrap_or(0);
            }
        }
        0
    }

    #[test]
    fn advice_keeps_contents_and_comes_once() {
        // 3 huge pages of pattern, not aligned: at least 2 whole ones inside.
        let n = 3 * HUGE + 4096;
        let buf: Vec<u8> = (0..n).map(|i| (i * 7 + i / 4096) as u8).collect();
        let first = advise_once(&buf);
        assert!(first.is_some(), "the first request for a weight is made");
        assert_eq!(advise_once(&buf), None, "a weight is advised once");
        assert!(buf.iter().enumerate().all(|(i, &b)| b == (i * 7 + i / 4096) as u8), "contents changed");
        match first.unwrap() {
            // Read back on x86-64 only: the aarch64 build is tested under
            // qemu-user, whose madvise succeeds without doing anything.
            Advice::Collapsed => {
                #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
                assert!(huge_kb_at(buf.as_ptr() as usize + 2 * HUGE) >= 2 * 2048, "collapsed, but no huge pages appeared");
            }
            other => eprintln!("huge pages not granted here ({other:?}): contents checked only"),
        }
        let small = vec![1u8; HUGE];
        assert_eq!(advise(&small[1..]), Advice::TooSmall);
    }
}
