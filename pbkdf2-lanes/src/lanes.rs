//! [`Lanes`]: resident jobs advanced one kernel call at a time, which a caller
//! refills between calls.

use crate::plan::{Kernel, Plan};
use crate::prep::Chain;
use crate::{Engine, Error, Job};

/// Jobs in flight on one core, advanced a kernel call at a time, so that jobs
/// that arrive while others run join them at the next call instead of waiting
/// for a whole batch to end.
///
/// Each [`step`](Lanes::step) runs the kernel the engine's [`Plan`] chooses for
/// the number of resident jobs, on the oldest of them (as many as the kernel is
/// wide), for at most the rounds it is given; jobs that finish are handed back
/// in the order they arrived. Results are exactly those of
/// [`Engine::derive`] for the same jobs.
///
/// ```
/// use pbkdf2_lanes::{Engine, Job, Lanes};
///
/// let mut lanes = Lanes::new(&Engine::detect());
/// lanes.push(Job::new(b"password", b"salt", 2), "first").unwrap();
/// let mut done = Vec::new();
/// lanes.step(1, |tag, key| done.push((tag, key)));
/// // A job that arrives meanwhile joins at the next call.
/// lanes.push(Job::new(b"other", b"pepper", 3), "second").unwrap();
/// while !lanes.is_empty() {
///     lanes.step(1, |tag, key| done.push((tag, key)));
/// }
/// assert_eq!(done[0].0, "first");
/// assert_eq!(done[0].1[..4], [0xae, 0x4d, 0x0c, 0x95]);
/// assert_eq!(done[1].1, pbkdf2_lanes::pbkdf2_sha256(b"other", b"pepper", 3)?);
/// # Ok::<(), pbkdf2_lanes::Error>(())
/// ```
pub struct Lanes<T> {
    plan: Plan,
    capacity: usize,
    /// Resident chains and their callers' tags, oldest first.
    chains: Vec<Chain>,
    tags: Vec<T>,
}

/// What one [`Lanes::step`] ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Step {
    /// The kernel.
    pub kernel: Kernel,
    /// The jobs it ran (the oldest resident ones).
    pub jobs: usize,
    /// The rounds it ran on each of them.
    pub rounds: u32,
}

impl<T> Lanes<T> {
    /// Empty lanes that run `engine`'s kernels; they hold up to its
    /// [`lanes`](Engine::lanes) jobs.
    pub fn new(engine: &Engine) -> Self {
        let capacity = engine.lanes().max(1);
        Lanes {
            plan: *engine.plan(),
            capacity,
            chains: Vec::with_capacity(capacity),
            tags: Vec::with_capacity(capacity),
        }
    }

    /// The most jobs resident at once.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Jobs resident (running or finished and not yet handed back).
    pub fn len(&self) -> usize {
        self.chains.len()
    }

    /// Whether no job is resident.
    pub fn is_empty(&self) -> bool {
        self.chains.is_empty()
    }

    /// Room for more jobs.
    pub fn free(&self) -> usize {
        self.capacity - self.chains.len()
    }

    /// Makes `job` resident, tagged `tag`: its preparation (the HMAC pads and U1,
    /// a few compressions) runs now, its rounds at the next steps. A job of one
    /// round is finished already and handed back at the next step. Refused, with
    /// its tag given back, when it has 0 rounds or the lanes are full.
    pub fn push(&mut self, job: Job<'_>, tag: T) -> Result<(), (Error, T)> {
        if job.rounds == 0 {
            return Err((Error::ZeroRounds { job: self.len() }, tag));
        }
        if self.free() == 0 {
            return Err((
                Error::LanesFull {
                    lanes: self.capacity,
                },
                tag,
            ));
        }
        self.chains
            .push(Chain::start(job.password, job.salt, job.rounds));
        self.tags.push(tag);
        Ok(())
    }

    /// The resident jobs' tags, oldest first.
    pub fn tags(&self) -> impl Iterator<Item = &T> {
        self.tags.iter()
    }

    /// Drops the resident jobs whose tag `keep` rejects (their callers went
    /// away, say), freeing their lanes; `keep` is asked once per job, and the
    /// jobs kept stay in their order.
    pub fn retain(&mut self, mut keep: impl FnMut(&T) -> bool) {
        self.take_out(|_, tag| !keep(tag), |_, _| {});
    }

    /// One kernel call: hands back the jobs already finished, then runs the
    /// plan's kernel for the resident jobs on the oldest of them for at most
    /// `max_rounds` rounds (fewer when one of them needs fewer), and hands back
    /// those that finished, oldest first, to `done` with their keys. `None` when
    /// no job was left to run.
    pub fn step(&mut self, max_rounds: u32, mut done: impl FnMut(T, [u8; 32])) -> Option<Step> {
        self.hand_back(&mut done);
        let kernel = self.plan.kernel(self.chains.len());
        let jobs = self.chains.len().min(kernel.width());
        let rounds = self.chains[..jobs]
            .iter()
            .map(|c| c.left)
            .min()?
            .min(max_rounds.max(1));
        // SAFETY: a plan only holds kernels of backends the CPU supports: it is
        // made by an `Engine`, whose constructors check `is_supported()`.
        unsafe { kernel.run(&mut self.chains[..jobs], rounds) };
        for c in &mut self.chains[..jobs] {
            c.left -= rounds;
        }
        self.hand_back(&mut done);
        Some(Step {
            kernel,
            jobs,
            rounds,
        })
    }

    /// Hands back, oldest first, the jobs with no round left.
    fn hand_back(&mut self, done: &mut impl FnMut(T, [u8; 32])) {
        self.take_out(
            |chain, _| chain.left == 0,
            |chain, tag| done(tag, chain.key()),
        );
    }

    /// Gives the jobs `out` picks to `taken`, oldest first, in one pass that asks
    /// `out` once per job; the others stay resident in their order.
    fn take_out(
        &mut self,
        mut out: impl FnMut(&Chain, &T) -> bool,
        mut taken: impl FnMut(Chain, T),
    ) {
        // Most kernel calls finish no job: then nothing moves.
        let Some(first) = (self.chains.iter().zip(&self.tags)).position(|(c, t)| out(c, t)) else {
            return;
        };
        let mut rest = self
            .chains
            .split_off(first)
            .into_iter()
            .zip(self.tags.split_off(first));
        if let Some((chain, tag)) = rest.next() {
            taken(chain, tag);
        }
        for (chain, tag) in rest {
            if out(&chain, &tag) {
                taken(chain, tag);
            } else {
                self.chains.push(chain);
                self.tags.push(tag);
            }
        }
    }
}

impl<T> core::fmt::Debug for Lanes<T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Lanes")
            .field("capacity", &self.capacity)
            .field("resident", &self.chains.len())
            .finish()
    }
}
