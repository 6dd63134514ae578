//! The engine's batcher, as a library user drives it: jobs batched
//! together (prefilled in chunks, joining as others leave, reusing an idle
//! session's prefix) give the tokens `Session::generate` gives alone; a
//! constrained job emits only what its constraint allows, and its
//! neighbours are unaffected.

use std::ops::ControlFlow;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use strata_engine::{
    BatchLimits, BatchObserver, Batcher, Constraint, Engine, EngineOptions, Error, Event, Events, Finish,
    GenerateOptions, Job, SamplingOptions,
};
use strata_format::{ConvertOptions, QuantPreset};

/// A plain family and a hybrid one (whose recurrent state is reused from
/// snapshots).
const FAMILIES: [&str; 2] = ["olmoe", "qwen3_next"];

fn engine(dir: &tempfile::TempDir, family: &str, sessions: usize) -> Engine {
    let hf = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata").join(family).join("hf");
    let model = dir.path().join("model");
    strata_format::convert(hf, &model, &ConvertOptions::new(QuantPreset::Q4)).unwrap();
    let options = EngineOptions { usage_file: Some(dir.path().join("usage.json")), sessions, ..Default::default() };
    Engine::open(&model, &options).unwrap()
}

fn options(max_new_tokens: usize, seed: u64) -> GenerateOptions {
    let sampling = SamplingOptions { temperature: 0.9, top_k: 40, top_p: 0.95, seed };
    GenerateOptions { max_new_tokens, sampling, ignore_eos: true, ..GenerateOptions::default() }
}

fn alone(engine: &Engine, prompt: &[u32], options: &GenerateOptions) -> Vec<u32> {
    engine.session().generate(prompt, options, |_| ControlFlow::Continue(())).unwrap().tokens
}

/// A job's tokens and how it ended.
fn collect(events: &Events) -> (Vec<u32>, Finish, usize) {
    let mut tokens = Vec::new();
    loop {
        match events.recv().expect("an end event") {
            Event::Token(token) => tokens.push(token),
            Event::Done { finish, completion_tokens } => return (tokens, finish, completion_tokens),
            Event::Failed(message) => panic!("job failed: {message}"),
        }
    }
}

/// Counts the prompt tokens whose KV was reused.
#[derive(Default)]
struct Reuse(AtomicUsize);

impl BatchObserver for Reuse {
    fn admitted(&self, _prompt_tokens: usize, reused_tokens: usize) {
        self.0.fetch_add(reused_tokens, Relaxed);
    }
}

#[test]
fn jobs_batched_by_the_engine_give_the_tokens_of_generate_alone() {
    let prompts: [Vec<u32>; 3] = [vec![5, 9, 14, 2, 77, 31, 8], vec![101, 3], (40..52).collect()];
    for family in FAMILIES {
        let dir = tempfile::tempdir().unwrap();
        let engine = engine(&dir, family, 2);
        let jobs: Vec<(Vec<u32>, GenerateOptions)> =
            prompts.iter().enumerate().map(|(i, p)| (p.clone(), options(5 + i, 11 + i as u64))).collect();
        let want: Vec<Vec<u32>> = jobs.iter().map(|(p, o)| alone(&engine, p, o)).collect();
        // The last prompt, its answer and more: the next turn of a chat
        // (the first job's session made room for the third one's).
        let mut turn = prompts[2].clone();
        turn.extend(&want[2]);
        turn.extend([60, 61, 62]);
        let want_turn = alone(&engine, &turn, &options(4, 3));

        // Two at a time, prompts fed 4 tokens a step: the third job waits,
        // and long prompts take several steps beside decoding ones.
        let limits = BatchLimits { max_batch: 2, prefill_chunk_tokens: 4, queue_jobs_max: 4 };
        let reuse = Arc::new(Reuse::default());
        let (batcher, thread) = Batcher::spawn(Arc::new(engine), limits, Arc::clone(&reuse) as _).unwrap();
        let events: Vec<Events> = jobs
            .iter()
            .map(|(prompt, options)| {
                let job = Job { prompt: prompt.clone(), options: options.clone(), constraint: None, request_id: None };
                batcher.submit(job).unwrap()
            })
            .collect();
        for (i, events) in events.iter().enumerate() {
            let (tokens, finish, completion_tokens) = collect(events);
            assert_eq!(tokens, want[i], "{family} job {i}");
            assert_eq!((finish, completion_tokens), (Finish::Length, want[i].len()), "{family} job {i}");
        }
        let events =
            batcher.submit(Job { prompt: turn, options: options(4, 3), constraint: None, request_id: None }).unwrap();
        assert_eq!(collect(&events).0, want_turn, "{family}: a prompt extending a finished job");
        assert!(reuse.0.load(Relaxed) > 0, "{family}: the finished job's KV was reused");
        drop(batcher);
        thread.join().unwrap();
    }
}

/// Allows only `allowed`, and is complete after `tokens_max` tokens.
struct AllowList {
    allowed: Vec<u32>,
    accepted: Vec<u32>,
    tokens_max: usize,
}

impl Constraint for AllowList {
    fn mask(&mut self, logits: &mut [f32]) -> strata_engine::Result<()> {
        for (id, logit) in logits.iter_mut().enumerate() {
            if !self.allowed.contains(&(id as u32)) {
                *logit = f32::NEG_INFINITY;
            }
        }
        Ok(())
    }

    fn accept(&mut self, token: u32) -> strata_engine::Result<()> {
        assert!(self.allowed.contains(&token), "accepted {token}, which mask disallowed");
        self.accepted.push(token);
        Ok(())
    }

    fn is_finished(&self) -> bool {
        self.accepted.len() == self.tokens_max
    }
}

#[test]
fn a_constrained_job_emits_only_allowed_tokens_and_leaves_its_neighbour_alone() {
    let allowed = vec![7, 8, 9, 200];
    let allow_list = || AllowList { allowed: allowed.clone(), accepted: Vec::new(), tokens_max: 5 };
    let (constrained_prompt, free_prompt) = (vec![5u32, 9, 14, 2], vec![101u32, 3, 17]);
    let dir = tempfile::tempdir().unwrap();
    let engine = engine(&dir, "olmoe", 2);
    let free_options = options(8, 21);
    let want_free = alone(&engine, &free_prompt, &free_options);
    let mut constraint = allow_list();
    let constrained_alone = engine
        .session()
        .generate_constrained(&constrained_prompt, &options(8, 5), Some(&mut constraint), |_| ControlFlow::Continue(()))
        .unwrap();
    assert_eq!(constrained_alone.finish, Finish::Stop, "a finished constraint stops");

    let limits = BatchLimits { max_batch: 2, prefill_chunk_tokens: 64, queue_jobs_max: 2 };
    let (batcher, thread) = Batcher::spawn(Arc::new(engine), limits, Arc::new(())).unwrap();
    let constrained = Job {
        prompt: constrained_prompt,
        options: options(8, 5),
        constraint: Some(Box::new(allow_list())),
        request_id: None,
    };
    let constrained = batcher.submit(constrained).unwrap();
    let free =
        batcher.submit(Job { prompt: free_prompt, options: free_options, constraint: None, request_id: None }).unwrap();
    let (tokens, finish, completion_tokens) = collect(&constrained);
    assert!(tokens.iter().all(|t| allowed.contains(t)), "{tokens:?} outside {allowed:?}");
    assert_eq!((finish, completion_tokens), (Finish::Stop, 5), "the constraint ended it");
    assert_eq!(tokens, constrained_alone.tokens, "constrained, batched and alone");
    assert!(tokens.iter().any(|&t| t != tokens[0]), "sampled among the allowed ({tokens:?})");
    assert_eq!(collect(&free).0, want_free, "the unconstrained neighbour");
    drop(batcher);
    thread.join().unwrap();
}

/// Panics when asked for its mask: a bug in a constraint.
struct Broken;

impl Constraint for Broken {
    fn mask(&mut self, _logits: &mut [f32]) -> strata_engine::Result<()> {
        panic!("a broken constraint");
    }

    fn accept(&mut self, _token: u32) -> strata_engine::Result<()> {
        Ok(())
    }

    fn is_finished(&self) -> bool {
        false
    }
}

#[test]
fn a_panicking_constraint_fails_its_own_job_only() {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine(&dir, "olmoe", 2);
    let prompt = vec![101u32, 3, 17];
    let want = alone(&engine, &prompt, &options(6, 2));
    let limits = BatchLimits { max_batch: 2, prefill_chunk_tokens: 64, queue_jobs_max: 2 };
    let (batcher, thread) = Batcher::spawn(Arc::new(engine), limits, Arc::new(())).unwrap();
    let broken =
        Job { prompt: vec![5, 9], options: options(6, 1), constraint: Some(Box::new(Broken)), request_id: None };
    let broken = batcher.submit(broken).unwrap();
    let fine = batcher.submit(Job { prompt, options: options(6, 2), constraint: None, request_id: None }).unwrap();
    match broken.recv() {
        Some(Event::Failed(message)) => assert!(message.contains("a broken constraint"), "{message}"),
        other => panic!("the broken job failed, not {other:?}"),
    }
    assert_eq!(collect(&fine).0, want, "its neighbour went on");
    assert!(batcher.is_running());
    drop(batcher);
    thread.join().unwrap();
}

#[test]
fn a_full_queue_refuses_and_a_dropped_place_is_given_back() {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine(&dir, "olmoe", 1);
    let limits = BatchLimits { max_batch: 1, prefill_chunk_tokens: 64, queue_jobs_max: 2 };
    let (batcher, thread) = Batcher::spawn(Arc::new(engine), limits, Arc::new(())).unwrap();
    let held = [batcher.reserve().unwrap(), batcher.reserve().unwrap()];
    assert_eq!(batcher.queue_depth(), 2);
    assert!(matches!(batcher.reserve(), Err(Error::QueueFull { jobs: 2 })));
    drop(held);
    assert_eq!(batcher.queue_depth(), 0);
    // A job the batch could not run is refused before it is queued.
    let empty = Job { prompt: Vec::new(), options: options(4, 0), constraint: None, request_id: None };
    assert!(matches!(batcher.submit(empty), Err(Error::InvalidRequest(_))));
    assert_eq!(batcher.queue_depth(), 0);
    // A job whose events are dropped is cancelled, and the next one runs.
    drop(
        batcher
            .submit(Job { prompt: vec![1, 2, 3], options: options(40, 0), constraint: None, request_id: None })
            .unwrap(),
    );
    let events =
        batcher.submit(Job { prompt: vec![4, 5], options: options(3, 0), constraint: None, request_id: None }).unwrap();
    assert_eq!(collect(&events).0.len(), 3);
    drop(batcher);
    thread.join().unwrap();
}
