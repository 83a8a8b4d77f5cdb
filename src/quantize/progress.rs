//! A tile-count progress bar with rate and ETA on stderr: redrawn in place
//! on a terminal, one line every 15 s otherwise (logs stay readable).

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub struct Progress {
    pub tiles: Arc<AtomicUsize>,
    pub label: Arc<Mutex<String>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// `1h02m`, `3m05s`, `12s`.
pub fn hms(s: f64) -> String {
    let s = s.max(0.0).round() as u64;
    match (s / 3600, (s / 60) % 60, s % 60) {
        (0, 0, sec) => format!("{sec}s"),
        (0, m, sec) => format!("{m}m{sec:02}s"),
        (h, m, _) => format!("{h}h{m:02}m"),
    }
}

fn line(done: usize, total: usize, started: Instant, label: &str, width: usize) -> String {
    let el = started.elapsed().as_secs_f64();
    let rate = done as f64 / el.max(1e-9);
    let frac = done as f64 / total.max(1) as f64;
    let filled = ((frac * width as f64) as usize).min(width);
    let eta = if done > 0 { hms((total - done.min(total)) as f64 / rate) } else { "?".into() };
    format!(
        "[{}{}] {:5.1}% {done}/{total} tiles, {rate:.0} tiles/s, elapsed {}, ETA {eta}  {label}",
        "#".repeat(filled),
        " ".repeat(width - filled),
        100.0 * frac,
        hms(el)
    )
}

impl Progress {
    /// Starts the display thread for `total` tiles (`show = false`: silent).
    pub fn start(total: usize, show: bool) -> Self {
        let (tiles, label, stop) = (Arc::new(AtomicUsize::new(0)), Arc::new(Mutex::new(String::new())), Arc::new(AtomicBool::new(false)));
        let thread = show.then(|| {
            let (tiles, label, stop) = (tiles.clone(), label.clone(), stop.clone());
            std::thread::spawn(move || {
                let tty = std::io::stderr().is_terminal();
                let started = Instant::now();
                let mut last_log = Instant::now();
                loop {
                    let done = stop.load(Ordering::Relaxed);
                    let l = line(tiles.load(Ordering::Relaxed), total, started, &label.lock().unwrap(), 30);
                    let mut err = std::io::stderr().lock();
                    if tty {
                        let _ = write!(err, "\r{l}\x1b[K");
                    } else if done || last_log.elapsed() >= Duration::from_secs(15) {
                        let _ = writeln!(err, "{l}");
                        last_log = Instant::now();
                    }
                    if done {
                        if tty {
                            let _ = writeln!(err);
                        }
                        break;
                    }
                    drop(err);
                    std::thread::sleep(Duration::from_millis(250));
                }
            })
        });
        Self { tiles, label, stop, thread }
    }

    pub fn set_label(&self, s: &str) {
        *self.label.lock().unwrap() = s.to_string();
    }

    /// Draws the final state and stops the display thread.
    pub fn finish(self) {}
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        assert_eq!(hms(12.4), "12s");
        assert_eq!(hms(185.0), "3m05s");
        assert_eq!(hms(3725.0), "1h02m");
        let l = line(0, 10, Instant::now(), "x", 10);
        assert!(l.contains("ETA ?") && l.contains("0/10"), "{l}");
    }
}
