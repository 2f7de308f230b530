/* test_serve_sched.c — the server's scheduler (src/serve/sched.c) on the batched engine, without HTTP: jobs queued
 * together decode in one batch, every job completes and its events come back in order, logprobs are valid, a seeded
 * job gives the same ids alone and in a batch, a cancelled job leaves its slot, bad requests are refused at submit,
 * closing ends queued and running jobs, and the time limits end a job that generates too long and one that waits too
 * long for a slot. */
#include "serve_fixture.h"

#include "serve/sched.h"

#define N_JOBS 4
#define MAX_NEW 12
#define MAX_REC 256

typedef struct {
    int32_t ids[MAX_REC];
    k3c_sampled t[MAX_REC];
    int n;           /* tokens */
    int64_t first_step; /* the engine's step count when the first token was taken */
    k3c_finish why;
    int events_after_end; /* events taken after the last one: must stay 0 */
} job_rec;

static k3c_request req_of(const k3c_sampler *sm, int64_t max_new) {
    return (k3c_request){.sampler = *sm, .max_new = max_new};
}

static k3c_sampler sampler_default(void) {
    return (k3c_sampler){.temperature = 1, .top_p = 1, .repetition_penalty = 1};
}

/* Takes j's events to the end. */
static void drain(k3c_sched_job *j, job_rec *r) {
    memset(r, 0, sizeof *r);
    r->why = K3C_FINISH_NONE;
    while (r->why == K3C_FINISH_NONE) {
        k3c_engine_event ev;
        k3c_sched_wait(j, &ev);
        if (ev.token.id >= 0) {
            if (r->n < MAX_REC) r->t[r->n] = ev.token, r->ids[r->n] = ev.token.id;
            r->n++;
        }
        r->why = (k3c_finish)ev.finish;
    }
    k3c_engine_event ev;
    r->events_after_end = k3c_sched_next(j, &ev, NULL, NULL);
}

static k3c_sched_job *submit(k3c_sched *s, const int32_t *prompt, int64_t n, const k3c_request *q) {
    k3c_sched_job *j = NULL;
    k3c_err err = {0};
    CHECK_OK(k3c_sched_submit(s, prompt, n, q, &j, &err), &err);
    return j;
}

static const int32_t PROMPTS[N_JOBS][6] = {
    {5, 6, 7, 8, 9, 10}, {40, 41, 42, 43, 44, 45}, {100, 3, 100, 3, 100, 3}, {7, 77, 177, 277, 377, 17}};

/* Four jobs queued together run as one batch; job 0 is seeded and sampled with every setting, and gives the same ids
 * alone. */
static void batch_and_seed(k3c_sched *s) {
    k3c_sampler seeded = sampler_default();
    seeded.temperature = 0.9, seeded.top_k = 40, seeded.min_p = 0.01, seeded.seed = 1234;
    seeded.repetition_penalty = 1.1, seeded.presence_penalty = 0.3, seeded.frequency_penalty = 0.2;
    job_rec alone, r[N_JOBS];
    k3c_request q0 = req_of(&seeded, MAX_NEW);
    k3c_sched_job *j = submit(s, PROMPTS[0], 6, &q0);
    if (j) drain(j, &alone);
    k3c_sched_release(j);
    k3c_engine_stats before;
    k3c_sched_get_stats(s, &before);
    k3c_request q[N_JOBS];
    const int32_t *p[N_JOBS];
    int64_t n[N_JOBS];
    for (int i = 0; i < N_JOBS; i++) {
        k3c_sampler sm = seeded;
        sm.seed = 1234 + (uint64_t)i * 7;
        q[i] = req_of(i == 0 ? &seeded : &sm, MAX_NEW);
        p[i] = PROMPTS[i], n[i] = 6;
    }
    k3c_sched_job *jobs[N_JOBS];
    k3c_err err = {0};
    CHECK_OK(k3c_sched_submit_all(s, N_JOBS, p, n, q, jobs, &err), &err);
    int complete = 0;
    for (int i = 0; i < N_JOBS && jobs[0]; i++) {
        drain(jobs[i], &r[i]);
        k3c_sched_release(jobs[i]);
        complete += (r[i].why == K3C_FINISH_LENGTH || r[i].why == K3C_FINISH_STOP) && r[i].n >= 1 &&
                    r[i].n <= MAX_NEW && !r[i].events_after_end;
    }
    CHECK(complete == N_JOBS, "every job of the batch completed, nothing after its last event (%d of %d)", complete,
          N_JOBS);
    k3c_engine_stats st;
    k3c_sched_get_stats(s, &st);
    const uint64_t steps = st.steps - before.steps, seqs = st.step_seqs - before.step_seqs;
    CHECK(st.batch_max == N_JOBS && steps <= MAX_NEW + 1 && seqs > steps,
          "decoded together: %llu steps ran %llu sequences (batch up to %d)", (unsigned long long)steps,
          (unsigned long long)seqs, st.batch_max);
    CHECK(alone.n == r[0].n && !memcmp(alone.ids, r[0].ids, sizeof(int32_t) * (size_t)(alone.n < MAX_REC ? alone.n : MAX_REC)),
          "seeded job: the same %d ids alone and in a batch of %d (got %d)", alone.n, N_JOBS, r[0].n);
    int differ = 0;
    for (int i = 1; i < N_JOBS; i++) differ += r[i].n != r[0].n || memcmp(r[i].ids, r[0].ids, sizeof r[0].ids);
    CHECK(differ == N_JOBS - 1, "the other jobs of the batch sampled their own ids");
}

/* Greedy with 5 top logprobs: each token's logprob <= 0, the top list sorted, the chosen id first in it. */
static void logprobs(k3c_sched *s) {
    k3c_sampler sm = sampler_default();
    sm.temperature = 0, sm.logprobs = 5;
    k3c_request q = req_of(&sm, MAX_NEW);
    job_rec r;
    k3c_sched_job *j = submit(s, PROMPTS[1], 6, &q);
    if (j) drain(j, &r);
    k3c_sched_release(j);
    int bad = 0;
    for (int i = 0; i < r.n && i < MAX_REC; i++) {
        const k3c_sampled *t = &r.t[i];
        bad += t->n_top != 5 || !(t->logprob <= 0) || t->top_id[0] != t->id || t->top_logprob[0] != t->logprob;
        for (int k = 1; k < t->n_top; k++)
            bad += !(t->top_logprob[k] <= t->top_logprob[k - 1]) || t->top_id[k] == t->id;
    }
    CHECK(r.n >= 1 && bad == 0, "logprobs of %d greedy tokens valid (%d bad)", r.n, bad);
    sm.logprobs = 0; /* without logprobs asked for, no top list */
    q = req_of(&sm, MAX_NEW);
    j = submit(s, PROMPTS[1], 6, &q);
    if (j) drain(j, &r);
    k3c_sched_release(j);
    CHECK(r.n >= 1 && r.t[0].n_top == 0, "no top list unless asked (%d)", r.t[0].n_top);
}

/* A job cancelled once its first token came ends CANCELLED (the tokens before the cancel delivered, nothing after the
 * end), its slot free; the next job is served. */
static void cancel(k3c_sched *s) {
    k3c_sampler sm = sampler_default();
    k3c_request q = req_of(&sm, 200);
    k3c_sched_job *ja = submit(s, PROMPTS[2], 6, &q);
    job_rec a;
    if (ja) {
        k3c_engine_event ev;
        k3c_sched_wait(ja, &ev);
        k3c_sched_cancel(ja);
        drain(ja, &a);
        a.n += ev.token.id >= 0;
    }
    k3c_sched_release(ja);
    CHECK(ja && a.why == K3C_FINISH_CANCELLED && a.n >= 1 && a.n < 200 && !a.events_after_end,
          "cancelled after its first token (%s, %d ids)", k3c_finish_name(a.why), a.n);
    k3c_engine_stats st;
    k3c_sched_get_stats(s, &st);
    CHECK(st.queued == 0 && st.running == 0, "slot freed (queued %d, running %d)", st.queued, st.running);
    q = req_of(&sm, MAX_NEW);
    k3c_sched_job *jb = submit(s, PROMPTS[3], 6, &q);
    job_rec b;
    if (jb) drain(jb, &b);
    k3c_sched_release(jb);
    CHECK(jb && (b.why == K3C_FINISH_STOP || b.why == K3C_FINISH_LENGTH) && b.n >= 1, "served afterwards");
}

/* Bad settings and ids outside the vocabulary are refused at submit with the engine's reason, and nothing is queued;
 * max_new 0 ends at once. */
static void refusals(k3c_sched *s) {
    k3c_sampler sm = sampler_default();
    sm.top_p = 2;
    k3c_request q = req_of(&sm, 4);
    k3c_sched_job *j = NULL;
    k3c_err err = {0};
    CHECK(k3c_sched_submit(s, PROMPTS[0], 6, &q, &j, &err) == K3C_EINVAL && !j, "top_p 2 refused: %s", err.msg);
    sm = sampler_default();
    q = req_of(&sm, 4);
    int32_t bad[2] = {5, 1 << 30};
    err = (k3c_err){0};
    CHECK(k3c_sched_submit(s, bad, 2, &q, &j, &err) == K3C_EINVAL && !j && strstr(err.msg, "outside"),
          "an id outside the vocabulary refused: %s", err.msg);
    /* all or none: a good request beside a bad one is not queued either */
    const int32_t *p2[2] = {PROMPTS[0], bad};
    int64_t n2[2] = {6, 2};
    k3c_request q2[2] = {q, q};
    k3c_sched_job *j2[2];
    CHECK(k3c_sched_submit_all(s, 2, p2, n2, q2, j2, &err) == K3C_EINVAL && !j2[0] && !j2[1],
          "a batch with a bad request refused whole");
    k3c_engine_stats st;
    k3c_sched_get_stats(s, &st);
    CHECK(st.queued == 0 && st.running == 0, "nothing queued by refusals (queued %d, running %d)", st.queued,
          st.running);
    q = req_of(&sm, 0);
    j = submit(s, PROMPTS[0], 6, &q);
    job_rec r;
    if (j) drain(j, &r);
    k3c_sched_release(j);
    CHECK(j && r.why == K3C_FINISH_LENGTH && r.n == 0, "max_new 0: length at once (%s)", k3c_finish_name(r.why));
}

/* Closing with a long job in the one slot and one queued behind it: both end CANCELLED, the queued one without a
 * token; afterwards submits are refused. */
static void close_ends_all(const k3c_weights *m) {
    k3c_sched *s = NULL;
    k3c_err err = {0};
    CHECK_OK(k3c_sched_new(m, 1, 4, &s, &err), &err);
    if (!s) return;
    k3c_sampler sm = sampler_default();
    const int32_t *p[2] = {PROMPTS[0], PROMPTS[1]};
    int64_t n[2] = {6, 6};
    k3c_request q[2] = {req_of(&sm, 2000), req_of(&sm, 2000)};
    k3c_sched_job *jobs[2] = {NULL, NULL};
    CHECK_OK(k3c_sched_submit_all(s, 2, p, n, q, jobs, &err), &err);
    k3c_sched_close(s);
    job_rec a = {0}, b = {0};
    if (jobs[0]) drain(jobs[0], &a), drain(jobs[1], &b);
    CHECK(a.why == K3C_FINISH_CANCELLED && b.why == K3C_FINISH_CANCELLED && b.n == 0,
          "close: both cancelled (%s, %s; %d ids queued)", k3c_finish_name(a.why), k3c_finish_name(b.why), b.n);
    k3c_sched_job *late = NULL;
    CHECK(k3c_sched_submit(s, PROMPTS[2], 6, &q[0], &late, &err) == K3C_ENOMEM && !late, "closed: refused (%s)",
          err.msg);
    k3c_sched_free(s);
    k3c_sched_cancel(jobs[0]); /* a job may outlive its scheduler: a no-op, then released */
    k3c_sched_release(jobs[0]);
    k3c_sched_release(jobs[1]);
}

/* One slot: a job with a 1 µs generation limit ends TIMEOUT at the step after it started, a job queued beside it with a
 * 1 µs queue limit ends QUEUE_TIMEOUT unstarted, and a third without limits is served. */
static void time_limits(const k3c_weights *m) {
    k3c_sched *s = NULL;
    k3c_err err = {0};
    CHECK_OK(k3c_sched_new(m, 1, 4, &s, &err), &err);
    if (!s) return;
    k3c_sampler sm = sampler_default();
    const int32_t *p[3] = {PROMPTS[2], PROMPTS[1], PROMPTS[3]};
    int64_t n[3] = {6, 6, 6};
    k3c_request q[3] = {req_of(&sm, 2000), req_of(&sm, MAX_NEW), req_of(&sm, MAX_NEW)};
    q[0].max_gen_s = 1e-6, q[1].max_queue_s = 1e-6;
    k3c_sched_job *jobs[3] = {NULL, NULL, NULL};
    CHECK_OK(k3c_sched_submit_all(s, 3, p, n, q, jobs, &err), &err);
    job_rec r[3];
    for (int i = 0; i < 3 && jobs[0]; i++) drain(jobs[i], &r[i]);
    if (jobs[0]) {
        CHECK(r[0].why == K3C_FINISH_TIMEOUT && r[0].n < 2000 && !strcmp(k3c_finish_name(r[0].why), "timeout"),
              "past its generation limit: %s after %d ids", k3c_finish_name(r[0].why), r[0].n);
        CHECK(r[1].why == K3C_FINISH_QUEUE_TIMEOUT && r[1].n == 0, "past its queue limit: %s after %d ids",
              k3c_finish_name(r[1].why), r[1].n);
        CHECK((r[2].why == K3C_FINISH_STOP || r[2].why == K3C_FINISH_LENGTH) && r[2].n >= 1,
              "no limits: served (%s, %d ids)", k3c_finish_name(r[2].why), r[2].n);
    }
    for (int i = 0; i < 3; i++) k3c_sched_release(jobs[i]);
    k3c_sched_free(s);
}

int main(void) {
    const char *tmp = test_tmpdir("serve_sched");
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", tmp);
    if (serve_model_dir(dir) != 0) return test_summary();
    k3c_serve sv;
    k3c_err err = {0};
    int rc = k3c_serve_open(dir, 0, NULL, &sv, &err);
    CHECK_OK(rc, &err);
    if (rc) return test_summary();
    k3c_sched *s = NULL;
    CHECK_OK(k3c_sched_new(sv.weights, N_JOBS, 8, &s, &err), &err);
    if (s) {
        batch_and_seed(s);
        logprobs(s);
        cancel(s);
        refusals(s);
        k3c_sched_free(s);
    }
    close_ends_all(sv.weights);
    time_limits(sv.weights);
    k3c_serve_close(&sv);
    return test_summary();
}
