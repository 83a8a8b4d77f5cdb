//! Streaming generation: sampled tokens as text pieces.

use super::{Context, LlamaError, Sampler, Token};

/// Text pieces of a generation, as they are sampled; ends at an
/// end-of-generation token, a stop string (not yielded) or `max_tokens`.
/// Pieces are whole UTF-8: bytes of a character split over tokens wait for
/// the rest, and text that may begin a stop string waits until it cannot.
pub struct Generation<'c, 'm, 's> {
    ctx: &'c mut Context<'m>,
    sampler: &'s mut Sampler,
    pos: i32,
    left: usize,
    stops: Vec<String>,
    bytes: Vec<u8>,
    text: String,
    done: bool,
    /// Every token sampled so far.
    pub tokens: Vec<Token>,
}

impl<'m> Context<'m> {
    /// Clears the context, evaluates `prompt` as sequence 0 and streams up
    /// to `max_tokens` sampled tokens.
    pub fn generate<'c, 's>(&'c mut self, prompt: &[Token], sampler: &'s mut Sampler, max_tokens: usize) -> Result<Generation<'c, 'm, 's>, LlamaError> {
        if prompt.len() >= self.n_ctx() as usize {
            return Err(LlamaError::Invalid(format!("a prompt of {} tokens leaves no room in a context of {}", prompt.len(), self.n_ctx())));
        }
        self.clear();
        sampler.reset();
        self.eval(prompt, 0, 0)?;
        Ok(Generation {
            ctx: self,
            sampler,
            pos: prompt.len() as i32,
            left: max_tokens,
            stops: Vec::new(),
            bytes: Vec::new(),
            text: String::new(),
            done: false,
            tokens: Vec::new(),
        })
    }
}

impl Generation<'_, '_, '_> {
    /// Also stop at any of these strings (which are not yielded).
    pub fn stop_at(mut self, stops: &[&str]) -> Self {
        self.stops = stops.iter().filter(|s| !s.is_empty()).map(|s| s.to_string()).collect();
        self
    }

    /// The longest tail of `text` that could still begin a stop string.
    fn held_back(&self) -> usize {
        let mut keep = 0;
        for s in &self.stops {
            for n in (1..s.len()).rev() {
                if n <= self.text.len() && self.text.is_char_boundary(self.text.len() - n) && s.starts_with(&self.text[self.text.len() - n..]) {
                    keep = keep.max(n);
                    break;
                }
            }
        }
        keep
    }

    /// No more tokens: the budget is spent (or an end token came) or the
    /// context is full.
    fn exhausted(&self) -> bool {
        self.left == 0 || self.pos as u32 >= self.ctx.n_ctx()
    }

    fn step(&mut self) -> Result<Option<String>, LlamaError> {
        loop {
            if self.done {
                return Ok(None);
            }
            if !self.exhausted() {
                let t = self.sampler.sample(self.ctx, -1)?;
                self.left -= 1;
                if self.ctx.model.is_eog(t) {
                    self.left = 0;
                } else {
                    self.tokens.push(t);
                    self.bytes.extend(self.ctx.model.token_bytes(t, false));
                    if self.left > 0 {
                        self.ctx.eval(&[t], 0, self.pos)?;
                        self.pos += 1;
                    }
                }
            }
            let finished = self.exhausted();
            // The valid UTF-8 prefix of the bytes joins the text (all of it, replaced, at the end).
            let valid = match std::str::from_utf8(&self.bytes) {
                Ok(s) => s.len(),
                Err(e) => e.valid_up_to(),
            };
            let cut = if finished { self.bytes.len() } else { valid };
            self.text.push_str(&String::from_utf8_lossy(&self.bytes[..cut]));
            self.bytes.drain(..cut);
            if let Some(at) = self.stops.iter().filter_map(|s| self.text.find(s.as_str())).min() {
                self.done = true;
                let out: String = self.text[..at].to_string();
                self.text.clear();
                return Ok((!out.is_empty()).then_some(out));
            }
            if finished {
                self.done = true;
                let out = std::mem::take(&mut self.text);
                return Ok((!out.is_empty()).then_some(out));
            }
            let ready = self.text.len() - self.held_back();
            if ready > 0 {
                let out: String = self.text.drain(..ready).collect();
                return Ok(Some(out));
            }
        }
    }
}

impl Iterator for Generation<'_, '_, '_> {
    type Item = Result<String, LlamaError>;

    fn next(&mut self) -> Option<Self::Item> {
        match self.step() {
            Ok(piece) => piece.map(Ok),
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }
}
