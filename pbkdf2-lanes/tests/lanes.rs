//! [`Lanes`]: jobs that arrive while others run, on every engine this CPU has;
//! and the plans that choose a kernel for each number of resident jobs.

use pbkdf2_lanes::{
    Backend, Engine, Error, Job, Kernel, KernelCost, Lanes, MAX_JOBS, MAX_SHA_NI_STREAMS, Plan,
};

fn reference(password: &[u8], salt: &[u8], rounds: u32) -> [u8; 32] {
    let mut out = [0u8; 32];
    pbkdf2::pbkdf2_hmac::<sha2::Sha256>(password, salt, rounds, &mut out);
    out
}

fn engines() -> Vec<Engine> {
    let mut v: Vec<Engine> = Backend::ALL
        .into_iter()
        .filter_map(Engine::with_backend)
        .collect();
    v.extend((1..=MAX_SHA_NI_STREAMS).filter_map(Engine::with_sha_ni_streams));
    v.extend([16, 32].into_iter().filter_map(Engine::with_avx512_lanes));
    v.push(Engine::detect());
    v.push(measured(Engine::detect()));
    v
}

/// The engine with the plan its kernels' costs make, measured briefly (a test
/// needs a measured plan, not a good one).
fn measured(engine: Engine) -> Engine {
    engine.with_costs(&engine.measure(50))
}

/// A small deterministic generator, so a failure replays.
struct Lcg(u64);
impl Lcg {
    fn next(&mut self, below: u32) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) % u64::from(below)) as u32
    }
}

#[test]
fn jobs_that_arrive_while_others_run_join_at_the_next_call() {
    for engine in engines() {
        let mut rng = Lcg(7);
        let jobs: Vec<(Vec<u8>, Vec<u8>, u32)> = (0..70u32)
            .map(|i| {
                let password = vec![i as u8; (i as usize * 29) % 100];
                let salt = vec![0x5a ^ i as u8; (i as usize * 13) % 40];
                (password, salt, 1 + rng.next(60))
            })
            .collect();
        let mut lanes = Lanes::new(&engine);
        assert_eq!(lanes.capacity(), engine.lanes());
        let mut got = vec![None; jobs.len()];
        let mut next = 0;
        let mut steps = 0;
        while next < jobs.len() || !lanes.is_empty() {
            // A few jobs arrive between calls, up to the room there is.
            let arriving = (rng.next(4) as usize).min(lanes.free());
            // Jobs of one round are finished at once, and handed back first.
            let mut finished = 0;
            for _ in 0..arriving {
                if let Some((p, s, c)) = jobs.get(next) {
                    lanes.push(Job::new(p, s, *c), next).unwrap();
                    finished += usize::from(*c == 1);
                    next += 1;
                }
            }
            let running = lanes.len() - finished;
            let max_rounds = 1 + rng.next(9);
            let step = lanes.step(max_rounds, |i, key| {
                assert!(got[i].replace(key).is_none(), "job {i} handed back twice");
            });
            if let Some(step) = step {
                steps += 1;
                assert!(step.rounds >= 1 && step.rounds <= max_rounds);
                // The plan's kernel for the jobs at hand, on as many as it is wide:
                // every resident job runs when the kernel has room for it.
                assert_eq!(step.kernel, engine.plan().kernel(running));
                assert_eq!(step.jobs, running.min(step.kernel.width()));
            }
        }
        assert!(steps > 0);
        for (i, (p, s, c)) in jobs.iter().enumerate() {
            assert_eq!(got[i], Some(reference(p, s, *c)), "{engine:?}: job {i}");
        }
    }
}

#[test]
fn a_job_alone_runs_on_the_single_job_kernel_and_a_step_is_bounded() {
    for engine in engines() {
        let mut lanes = Lanes::new(&engine);
        lanes.push(Job::new(b"alone", b"salt", 1001), ()).unwrap();
        let mut keys = Vec::new();
        let mut ran = 0;
        while let Some(step) = lanes.step(64, |(), key| keys.push(key)) {
            assert_eq!((step.kernel, step.jobs), (engine.plan().kernel(1), 1));
            assert!(step.rounds <= 64);
            ran += step.rounds;
        }
        // Rounds 2..=1001 ran in the steps; the first is the preparation's.
        assert_eq!(ran, 1000);
        assert_eq!(keys, [reference(b"alone", b"salt", 1001)]);
    }
}

#[test]
fn full_lanes_and_zero_rounds_are_refused_with_the_tag_back() {
    let engine = Engine::detect();
    let mut lanes = Lanes::new(&engine);
    assert_eq!(
        lanes.push(Job::new(b"p", b"s", 0), "zero").unwrap_err(),
        (Error::ZeroRounds { job: 0 }, "zero")
    );
    for _ in 0..lanes.capacity() {
        lanes.push(Job::new(b"p", b"s", 5), "fits").unwrap();
    }
    assert_eq!(lanes.free(), 0);
    let (err, tag) = lanes.push(Job::new(b"p", b"s", 5), "over").unwrap_err();
    assert_eq!(
        (err, tag),
        (
            Error::LanesFull {
                lanes: engine.lanes()
            },
            "over"
        )
    );
    assert_eq!(
        err.to_string(),
        format!("all {} lanes hold a job", engine.lanes())
    );
}

#[test]
fn dropped_jobs_free_their_lanes_and_the_rest_run_on() {
    for engine in engines() {
        let mut lanes = Lanes::new(&engine);
        let n = lanes.capacity().min(6);
        for i in 0..n {
            let password = [i as u8; 8];
            lanes.push(Job::new(&password, b"salt", 40), i).unwrap();
        }
        lanes.step(10, |_, _| panic!("nothing finishes in 10 of 40 rounds"));
        let mut asked = 0;
        lanes.retain(|&i| {
            asked += 1;
            i % 2 == 0
        });
        assert_eq!(asked, n, "each job's tag is asked about once");
        assert_eq!(
            lanes.tags().copied().collect::<Vec<_>>(),
            (0..n).step_by(2).collect::<Vec<_>>()
        );
        let mut done = Vec::new();
        while lanes.step(u32::MAX, |i, key| done.push((i, key))).is_some() {}
        assert_eq!(done.len(), n.div_ceil(2));
        for (i, key) in done {
            assert_eq!(
                key,
                reference(&[i as u8; 8], b"salt", 40),
                "{engine:?}: job {i}"
            );
        }
    }
}

#[test]
fn plans_and_kernels_read_back_what_they_print() {
    for engine in engines() {
        let plan = *engine.plan();
        assert_eq!(plan.to_string().parse::<Plan>(), Ok(plan), "{plan}");
        assert_eq!(engine.with_plan(plan), Ok(engine));
        for k in engine.kernels() {
            assert_eq!(k.to_string().parse::<Kernel>(), Ok(k));
        }
    }
    let plan: Plan = "1: sha-ni x1, 2-8: sha-ni x4, 9 - 18: avx512 x16"
        .parse()
        .unwrap();
    assert_eq!(plan.kernel(5), sha(4));
    // The last kernel also runs for more jobs than the plan names.
    assert_eq!(plan.kernel(32), Kernel::Avx512 { vectors: 1 });
    assert_eq!(plan.lanes(), 16);
    for bad in [
        "",
        "2: sha-ni x2",
        "1: sha-ni x1, 3: sha-ni x2",
        "1-33: portable",
        "1: sha-ni x9",
        "1: avx512 x8",
        "1 sha-ni x1",
        "one: portable",
        "1: portable,",
    ] {
        assert!(bad.parse::<Plan>().is_err(), "{bad:?} parsed");
    }
    assert_eq!(
        "1-3: avx2 x7".parse::<Plan>().unwrap_err().to_string(),
        "unknown kernel \"avx2 x7\""
    );
    // A plan with a kernel of another backend is refused by a forced engine.
    let portable = Engine::with_backend(Backend::Portable).unwrap();
    assert_eq!(portable.with_plan(plan), Err(sha(1)));
}

fn cost(kernel: Kernel, ns_per_round: f64) -> KernelCost {
    KernelCost {
        kernel,
        ns_per_round,
    }
}

fn sha(streams: u8) -> Kernel {
    Kernel::ShaNi { streams }
}

#[test]
fn a_plan_takes_the_cheapest_kernel_per_job_for_each_number_of_jobs() {
    let x16 = Kernel::Avx512 { vectors: 1 };
    let x32 = Kernel::Avx512 { vectors: 2 };
    // Per job-round: one stream 270, two 150 each, four 80, eight 70; one
    // vector 1,200 for up to 16 jobs, two 1,900 for up to 32.
    let costs = [
        cost(Kernel::Portable, 330.0),
        cost(sha(1), 270.0),
        cost(sha(2), 300.0),
        cost(sha(4), 320.0),
        cost(sha(8), 560.0),
        cost(x16, 1200.0),
        cost(x32, 1900.0),
    ];
    let plan = Plan::from_costs(&costs).unwrap();
    // Eight streams at 70 per job beat one vector's 75 at best by more than the
    // 5 % of a near tie; two vectors, which run every job at hand, cost 1,900 / n
    // per job: within 5 % of eight streams from 26 jobs on, so they run from 26.
    let expected = |n: usize| match n {
        1 => sha(1),
        2..=3 => sha(2),
        4..=7 => sha(4),
        8..=25 => sha(8),
        _ => x32,
    };
    for n in 1..=MAX_JOBS {
        assert_eq!(plan.kernel(n), expected(n), "{n} jobs");
    }
    assert_eq!(plan.kernel(0), plan.kernel(1));
    assert_eq!(plan.kernel(1000), plan.kernel(MAX_JOBS));
    assert_eq!(plan.lanes(), 32);
    assert_eq!(
        plan.to_string(),
        "1: sha-ni x1, 2-3: sha-ni x2, 4-7: sha-ni x4, 8-25: sha-ni x8, 26-32: avx512 x32"
    );
    // Nothing that runs one job: no plan. A kernel that was not measured (an
    // infinite or zero cost) is never chosen.
    assert_eq!(Plan::from_costs(&[cost(sha(2), 100.0)]), None);
    assert_eq!(Plan::from_costs(&[]), None);
    // Within 5 %, the kernel that runs more of the jobs wins; beyond, the cheaper.
    let near = Plan::from_costs(&[
        cost(sha(1), 100.0),
        cost(sha(2), 208.0),
        cost(sha(3), 330.0),
    ])
    .unwrap();
    assert_eq!((near.kernel(2), near.kernel(3)), (sha(2), sha(2)));
    let plan = Plan::from_costs(&[
        cost(sha(1), 100.0),
        cost(sha(2), f64::INFINITY),
        cost(sha(4), 0.0),
    ])
    .unwrap();
    assert_eq!((plan.kernel(MAX_JOBS), plan.lanes()), (sha(1), 1));
}

#[test]
fn an_engine_plans_only_with_its_own_kernels() {
    for engine in engines() {
        let kernels = engine.kernels();
        let costs = engine.measure(20);
        assert_eq!(costs.iter().map(|c| c.kernel).collect::<Vec<_>>(), kernels);
        assert!(
            costs
                .iter()
                .all(|c| c.ns_per_round > 0.0 && c.ns_per_compression() > 0.0)
        );
        for n in 1..=MAX_JOBS {
            assert!(kernels.contains(&engine.plan().kernel(n)), "{engine:?}");
            assert!(
                kernels.contains(&engine.with_costs(&costs).plan().kernel(n)),
                "{engine:?}"
            );
        }
        // Costs of kernels the engine may not run are ignored, and so is a set
        // of costs that cannot make a plan.
        let foreign = [
            cost(Kernel::Portable, 1.0),
            cost(sha(8), 1.0),
            cost(Kernel::Avx512 { vectors: 2 }, 1.0),
        ];
        let planned = engine.with_costs(&foreign);
        for n in 1..=MAX_JOBS {
            assert!(kernels.contains(&planned.plan().kernel(n)), "{engine:?}");
        }
    }
    let portable = Engine::with_backend(Backend::Portable).unwrap();
    assert_eq!(portable.kernels(), [Kernel::Portable]);
    assert_eq!(portable.with_costs(&[cost(sha(1), 1.0)]), portable);
    if let Some(e) = Engine::with_sha_ni_streams(3) {
        assert_eq!(e.kernels(), [sha(1), sha(2), sha(3)]);
    }
    if let Some(e) = Engine::with_backend(Backend::ShaNi) {
        // The stream count is measured: a forced SHA-NI engine may run eight.
        let eight = e.with_costs(&[cost(sha(1), 100.0), cost(sha(8), 400.0)]);
        assert_eq!((eight.plan().kernel(8), eight.lanes()), (sha(8), 8));
    }
}
