/* test_serve_sched.c — the server's scheduler (src/serve/sched.c) on the batched engine, without HTTP: jobs decode
 * together (a sink holds the engine thread until every job is queued, so the batch is certain, not timed), every job
 * completes, logprobs are valid, a seeded job gives the same ids alone and in a batch, a cancelled job leaves its slot,
 * a job the engine refuses ends with an error, closing ends queued and running jobs, and the time limits end a job that
 * generates too long and one that waits too long for a slot. */
#include "serve_fixture.h"

#include "serve/sched.h"

#include <pthread.h>

#define N_JOBS 4
#define MAX_NEW 12

typedef struct job_rec {
    k3c_sched *s;
    pthread_mutex_t *mu;
    pthread_cond_t *cv;
    int *gate; /* non-NULL: the first token waits until *gate is 0 */
    int32_t ids[64];
    k3c_sampled t[64];
    int n, done, max_running;
    int first, last; /* the global order of this job's first and last token */
    k3c_sched_finish why;
    int64_t n_gen;
    k3c_err err;
} job_rec;

static int g_order; /* tokens seen by every sink, under g_mu */

static int rec_token(void *ctx, const k3c_sampled *t, int is_stop) {
    job_rec *r = ctx;
    pthread_mutex_lock(r->mu);
    r->last = ++g_order;
    if (r->n == 0) r->first = r->last;
    if (r->gate && r->n == 0)
        while (*r->gate) pthread_cond_wait(r->cv, r->mu);
    if (r->n < 64) r->t[r->n] = *t, r->ids[r->n] = t->id;
    r->n++;
    pthread_mutex_unlock(r->mu);
    k3c_sched_stats st;
    k3c_sched_get_stats(r->s, &st);
    pthread_mutex_lock(r->mu);
    if (st.running > r->max_running) r->max_running = st.running;
    pthread_mutex_unlock(r->mu);
    (void)is_stop;
    return 0;
}

static void rec_done(void *ctx, k3c_sched_finish why, int64_t n_gen, const k3c_err *err) {
    job_rec *r = ctx;
    pthread_mutex_lock(r->mu);
    r->why = why;
    r->n_gen = n_gen;
    if (err) r->err = *err;
    r->done = 1;
    pthread_cond_broadcast(r->cv);
    pthread_mutex_unlock(r->mu);
}

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;

static void rec_init(job_rec *r, k3c_sched *s, int *gate) {
    memset(r, 0, sizeof *r);
    r->s = s, r->mu = &g_mu, r->cv = &g_cv, r->gate = gate;
}

static void wait_done(job_rec *r) {
    pthread_mutex_lock(&g_mu);
    while (!r->done) pthread_cond_wait(&g_cv, &g_mu);
    pthread_mutex_unlock(&g_mu);
}

static void open_gate(int *gate) {
    pthread_mutex_lock(&g_mu);
    *gate = 0;
    pthread_cond_broadcast(&g_cv);
    pthread_mutex_unlock(&g_mu);
}

static k3c_sched_job *submit(k3c_sched *s, const int32_t *prompt, int64_t n, const k3c_gen_params *p, job_rec *r) {
    k3c_sched_req q = {.prompt = prompt, .n_prompt = n, .max_new = MAX_NEW, .params = *p};
    k3c_sched_sink sink = {rec_token, rec_done, r};
    k3c_sched_job *j = NULL;
    k3c_err err = {0};
    CHECK_OK(k3c_sched_submit(s, &q, &sink, &j, &err), &err);
    return j;
}

static const int32_t PROMPTS[N_JOBS][6] = {
    {5, 6, 7, 8, 9, 10}, {40, 41, 42, 43, 44, 45}, {100, 3, 100, 3, 100, 3}, {7, 77, 177, 277, 377, 17}};

/* Four jobs in one batch (the first token of job 0 holds the engine until all are queued); job 0 is seeded and
 * sampled with every setting, and gives the same ids alone. */
static void batch_and_seed(k3c_sched *s) {
    k3c_gen_params seeded;
    k3c_gen_params_default(&seeded);
    seeded.temperature = 0.9, seeded.top_k = 40, seeded.min_p = 0.01, seeded.seed = 1234;
    seeded.repetition_penalty = 1.1, seeded.presence_penalty = 0.3, seeded.frequency_penalty = 0.2;
    job_rec alone, r[N_JOBS];
    rec_init(&alone, s, NULL);
    k3c_sched_job *j = submit(s, PROMPTS[0], 6, &seeded, &alone);
    if (j) wait_done(&alone);
    k3c_sched_release(j);
    int gate = 1;
    k3c_sched_job *jobs[N_JOBS];
    for (int i = 0; i < N_JOBS; i++) {
        k3c_gen_params p = seeded;
        p.seed = 1234 + (uint64_t)i * 7;
        rec_init(&r[i], s, i == 0 ? &gate : NULL);
        jobs[i] = submit(s, PROMPTS[i], 6, i == 0 ? &seeded : &p, &r[i]);
    }
    open_gate(&gate);
    int complete = 0, max_running = 0;
    for (int i = 0; i < N_JOBS; i++) {
        if (jobs[i]) wait_done(&r[i]);
        k3c_sched_release(jobs[i]);
        complete += r[i].done && (r[i].why == K3C_SCHED_FINISH_LENGTH || r[i].why == K3C_SCHED_FINISH_STOP) &&
                    r[i].n == r[i].n_gen && r[i].n_gen >= 1 && r[i].n_gen <= MAX_NEW;
        if (r[i].max_running > max_running) max_running = r[i].max_running;
    }
    CHECK(complete == N_JOBS, "every job of the batch completed (%d of %d)", complete, N_JOBS);
    CHECK(max_running == N_JOBS, "all %d jobs in slots at once (saw at most %d)", N_JOBS, max_running);
    /* decoded together, not one after another: the others' first tokens come before job 0's last */
    int interleaved = 0;
    for (int i = 1; i < N_JOBS; i++) interleaved += r[i].first < r[0].last;
    k3c_sched_stats st;
    k3c_sched_get_stats(s, &st);
    CHECK(interleaved == N_JOBS - 1 && st.batch_max == N_JOBS && st.step_seqs > st.steps,
          "tokens interleaved (%d of %d), engine steps ran up to %d sequences (%llu over %llu steps)", interleaved,
          N_JOBS - 1, st.batch_max, (unsigned long long)st.step_seqs, (unsigned long long)st.steps);
    CHECK(alone.n == r[0].n && !memcmp(alone.ids, r[0].ids, sizeof(int32_t) * (size_t)(alone.n < 64 ? alone.n : 64)),
          "seeded job: the same %d ids alone and in a batch of %d (got %d)", alone.n, N_JOBS, r[0].n);
    int differ = 0;
    for (int i = 1; i < N_JOBS; i++) differ += r[i].n != r[0].n || memcmp(r[i].ids, r[0].ids, sizeof r[0].ids);
    CHECK(differ == N_JOBS - 1, "the other jobs of the batch sampled their own ids");
}

/* Greedy with 5 top logprobs: each token's logprob <= 0, the top list sorted, the chosen id first in it. */
static void logprobs(k3c_sched *s) {
    k3c_gen_params p;
    k3c_gen_params_default(&p);
    p.temperature = 0, p.logprobs = 1, p.top_logprobs = 5;
    job_rec r;
    rec_init(&r, s, NULL);
    k3c_sched_job *j = submit(s, PROMPTS[1], 6, &p, &r);
    if (j) wait_done(&r);
    k3c_sched_release(j);
    int bad = 0;
    for (int i = 0; i < r.n && i < 64; i++) {
        const k3c_sampled *t = &r.t[i];
        bad += t->n_top != 5 || !(t->logprob <= 0) || t->top_id[0] != t->id || t->top_logprob[0] != t->logprob;
        for (int k = 1; k < t->n_top; k++)
            bad += !(t->top_logprob[k] <= t->top_logprob[k - 1]) || t->top_id[k] == t->id;
    }
    CHECK(r.n >= 1 && bad == 0, "logprobs of %d greedy tokens valid (%d bad)", r.n, bad);
    /* without logprobs asked for, no top list */
    p.logprobs = 0, p.top_logprobs = 0;
    rec_init(&r, s, NULL);
    j = submit(s, PROMPTS[1], 6, &p, &r);
    if (j) wait_done(&r);
    k3c_sched_release(j);
    CHECK(r.n >= 1 && r.t[0].n_top == 0, "no top list unless asked (%d)", r.t[0].n_top);
}

/* A job cancelled while it decodes (its first token holds the engine) ends CANCELLED after one token, its slot free. */
static void cancel(k3c_sched *s) {
    k3c_gen_params p;
    k3c_gen_params_default(&p);
    int gate = 1;
    job_rec a, b;
    rec_init(&a, s, &gate);
    rec_init(&b, s, NULL);
    k3c_sched_job *ja = submit(s, PROMPTS[2], 6, &p, &a);
    for (int i = 0; i < 400; i++) { /* until the engine thread waits in a's first token */
        pthread_mutex_lock(&g_mu);
        int started = a.n > 0;
        pthread_mutex_unlock(&g_mu);
        if (started) break;
        usleep(5000);
    }
    if (ja) k3c_sched_cancel(ja);
    open_gate(&gate);
    if (ja) wait_done(&a);
    k3c_sched_release(ja);
    CHECK(a.why == K3C_SCHED_FINISH_CANCELLED && a.n == 1, "cancelled after its first token (%d, %d ids)", a.why, a.n);
    k3c_sched_stats st;
    k3c_sched_get_stats(s, &st);
    CHECK(st.queued == 0 && st.running == 0, "slot freed (queued %d, running %d)", st.queued, st.running);
    k3c_sched_job *jb = submit(s, PROMPTS[3], 6, &p, &b);
    if (jb) wait_done(&b);
    k3c_sched_release(jb);
    CHECK(b.why != K3C_SCHED_FINISH_CANCELLED && b.why != K3C_SCHED_FINISH_ERROR && b.n >= 1, "served afterwards");
}

/* Bad settings are refused at submit; a prompt with an id outside the vocabulary is refused by the engine: an error
 * event, and the scheduler goes on. */
static void refusals(k3c_sched *s) {
    k3c_gen_params p;
    k3c_gen_params_default(&p);
    p.top_p = 2;
    k3c_sched_req q = {.prompt = PROMPTS[0], .n_prompt = 6, .max_new = 4, .params = p};
    job_rec r;
    rec_init(&r, s, NULL);
    k3c_sched_sink sink = {rec_token, rec_done, &r};
    k3c_sched_job *j = NULL;
    k3c_err err = {0};
    CHECK(k3c_sched_submit(s, &q, &sink, &j, &err) == K3C_EINVAL && !j, "top_p 2 refused: %s", err.msg);
    k3c_gen_params_default(&p);
    int32_t bad[2] = {5, 1 << 30};
    j = submit(s, bad, 2, &p, &r);
    if (j) wait_done(&r);
    k3c_sched_release(j);
    CHECK(r.why == K3C_SCHED_FINISH_ERROR && r.n == 0 && r.err.msg[0], "engine refusal: an error (%d: %s)", r.why,
          r.err.msg);
}

/* Closing with a job held in its first token and one queued behind (1 slot): both get on_done, the queued one
 * CANCELLED. */
static void close_ends_all(const k3c_weights *m) {
    k3c_sched *s = NULL;
    k3c_err err = {0};
    CHECK_OK(k3c_sched_new(m, 1, 4, &s, &err), &err);
    if (!s) return;
    k3c_gen_params p;
    k3c_gen_params_default(&p);
    int gate = 1;
    job_rec a, b;
    rec_init(&a, s, &gate);
    rec_init(&b, s, NULL);
    k3c_sched_job *ja = submit(s, PROMPTS[0], 6, &p, &a), *jb = submit(s, PROMPTS[1], 6, &p, &b);
    k3c_sched_close(s);
    open_gate(&gate);
    if (ja) wait_done(&a);
    if (jb) wait_done(&b);
    CHECK(a.why == K3C_SCHED_FINISH_CANCELLED && b.why == K3C_SCHED_FINISH_CANCELLED && b.n == 0,
          "close: both cancelled (%d, %d)", a.why, b.why);
    k3c_sched_release(ja);
    k3c_sched_release(jb);
    k3c_sched_free(s);
}

static k3c_sched_job *submit_limited(k3c_sched *s, const int32_t *prompt, double max_gen_s, double max_queue_s,
                                     job_rec *r) {
    k3c_sched_req q = {
        .prompt = prompt, .n_prompt = 6, .max_new = MAX_NEW, .max_gen_s = max_gen_s, .max_queue_s = max_queue_s};
    k3c_gen_params_default(&q.params);
    k3c_sched_sink sink = {rec_token, rec_done, r};
    k3c_sched_job *j = NULL;
    k3c_err err = {0};
    CHECK_OK(k3c_sched_submit(s, &q, &sink, &j, &err), &err);
    return j;
}

/* One slot: a job held in its first token for 0.4 s runs past its 0.1 s generation limit, a job queued behind it with
 * a 0.1 s queue limit times out unstarted, and a third without limits is served. */
static void time_limits(const k3c_weights *m) {
    k3c_sched *s = NULL;
    k3c_err err = {0};
    CHECK_OK(k3c_sched_new(m, 1, 4, &s, &err), &err);
    if (!s) return;
    int gate = 1;
    job_rec a, b, c;
    rec_init(&a, s, &gate);
    rec_init(&b, s, NULL);
    rec_init(&c, s, NULL);
    k3c_sched_job *ja = submit_limited(s, PROMPTS[2], 0.1, 0, &a), *jb = submit_limited(s, PROMPTS[1], 0, 0.1, &b),
                  *jc = submit_limited(s, PROMPTS[3], 0, 0, &c);
    usleep(400 * 1000);
    open_gate(&gate);
    if (ja) wait_done(&a);
    if (jb) wait_done(&b);
    if (jc) wait_done(&c);
    CHECK(a.why == K3C_SCHED_FINISH_TIMEOUT && a.n_gen >= 1 && !strcmp(k3c_sched_finish_name(a.why), "timeout"),
          "past its generation limit: %s after %lld ids", k3c_sched_finish_name(a.why), (long long)a.n_gen);
    CHECK(b.why == K3C_SCHED_FINISH_QUEUE_TIMEOUT && b.n == 0, "past its queue limit: %s after %d ids",
          k3c_sched_finish_name(b.why), b.n);
    CHECK((c.why == K3C_SCHED_FINISH_STOP || c.why == K3C_SCHED_FINISH_LENGTH) && c.n >= 1,
          "no limits: served (%s, %d ids)", k3c_sched_finish_name(c.why), c.n);
    k3c_sched_release(ja);
    k3c_sched_release(jb);
    k3c_sched_release(jc);
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
