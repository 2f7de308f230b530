/* env_assistant.c — a long-horizon personal-assistant simulation: simulated days with calendar, to-dos, notes and a
 * clock; a user whose preferences are revealed over the days; scored on the final state and milestones (requests met,
 * preferences applied, a to-do done on the right day, preferences remembered in notes, no contradictions). POST.md. */
#include "post/env.h"

#include <stdlib.h>
#include <string.h>

enum { MAX_EVENTS = 32, MAX_TODOS = 16, MAX_NOTES = 16 };

typedef struct {
    int day, hour, active;
    char title[48];
} event;
typedef struct {
    char text[64];
    int done_day;
} todo;
typedef struct {
    char key[32], text[128];
} note;

typedef struct {
    int days, today, morning; /* preference: mornings 8–11, else afternoons 13–16 */
    int day_off, d1, dt, lo,
        hi; /* the day off (revealed on day 2), request 1's day, the to-do's day, request 2's range */
    char name[16], title1[48], title2[48], todo_text[64];
    event ev[MAX_EVENTS];
    int nev;
    todo td[MAX_TODOS];
    int ntd;
    note nt[MAX_NOTES];
    int nnt;
} asst;

static const char *NAMES[] = {"Ada", "Bo", "Chen", "Dana", "Eli", "Fay", "Gus", "Hana"};
static const char *TITLES[] = {"dentist",      "team sync",     "gym",     "lunch with Sam", "car service",
                               "piano lesson", "budget review", "haircut", "call with mom",  "vet visit"};
static const char *TODOS[] = {"pay rent", "buy milk", "send report", "book flights", "water plants", "renew passport"};

static int pref_lo(const asst *a) { return a->morning ? 8 : 13; }
static int pref_ok(const asst *a, int hour) { return hour >= pref_lo(a) && hour <= pref_lo(a) + 3; }

/* What the user says at the start of day d. */
static void day_message(const asst *a, int d, k3c_sbuf *b) {
    k3c_sbuf_printf(b, "Day %d of %d.", d, a->days);
    if (d == 1)
        k3c_sbuf_printf(b, " Hi, I'm %s. I prefer appointments in the %s. Please schedule '%s' on day %d.", a->name,
                        a->morning ? "morning" : "afternoon", a->title1, a->d1);
    if (d == 2)
        k3c_sbuf_printf(b, " Day %d is my day off: keep it free. Add a to-do '%s' and mark it done on day %d.",
                        a->day_off, a->todo_text, a->dt);
    if (d == 3) k3c_sbuf_printf(b, " Please schedule '%s' on a day from %d to %d.", a->title2, a->lo, a->hi);
    if (d > 3) k3c_sbuf_printf(b, "%s", " Nothing new today.");
    k3c_sbuf_printf(b, "%s", " Call advance_clock when today's work is done.");
}

static int init(k3c_env *e, k3c_err *err) {
    asst *a = calloc(1, sizeof *a);
    if (!a) return k3c_errf(err, K3C_ENOMEM, "out of memory");
    e->st = a;
    char key[256];
    do {
        a->days = (int)k3c_env_randint(e, 4, 7);
        a->morning = (int)k3c_env_randint(e, 0, 1);
        a->day_off = (int)k3c_env_randint(e, 3, a->days);
        do a->d1 = (int)k3c_env_randint(e, 2, a->days);
        while (a->d1 == a->day_off);
        a->dt = (int)k3c_env_randint(e, 2, a->days);
        a->lo = a->day_off > 3 ? a->day_off - 1 : 3;
        a->hi = a->lo + 1 <= a->days ? a->lo + 1 : a->days;
        if (a->hi == a->lo) a->lo--;
        snprintf(a->name, sizeof a->name, "%s", NAMES[k3c_env_randint(e, 0, 7)]);
        snprintf(a->title1, sizeof a->title1, "%s", TITLES[k3c_env_randint(e, 0, 9)]);
        do snprintf(a->title2, sizeof a->title2, "%s", TITLES[k3c_env_randint(e, 0, 9)]);
        while (!strcmp(a->title1, a->title2));
        snprintf(a->todo_text, sizeof a->todo_text, "%s", TODOS[k3c_env_randint(e, 0, 5)]);
        snprintf(key, sizeof key, "%d|%d|%d|%d|%d|%d|%s|%s|%s|%s", a->days, a->morning, a->day_off, a->d1, a->dt, a->lo,
                 a->name, a->title1, a->title2, a->todo_text);
    } while (!k3c_env_in_split(k3c_env_hash(key, strlen(key), 14695981039346656037ull), e->split));
    a->today = 1;
    k3c_sbuf_append(&e->system,
                    "You are a personal assistant. Use the tools to manage the user's calendar, to-dos and notes. "
                    "Remember what the user tells you in notes. Hours are 0-23.",
                    148);
    day_message(a, 1, &e->user);
    k3c_env_tool(&e->tools, "calendar_add", "Add an event",
                 "{\"day\":{\"type\":\"integer\"},\"hour\":{\"type\":\"integer\"},"
                 "\"title\":{\"type\":\"string\"}}",
                 "[\"day\",\"hour\",\"title\"]");
    k3c_env_tool(&e->tools, "calendar_remove", "Remove an event by id", "{\"id\":{\"type\":\"integer\"}}", "[\"id\"]");
    k3c_env_tool(&e->tools, "calendar_list", "List the events", "{}", "[]");
    k3c_env_tool(&e->tools, "todo_add", "Add a to-do", "{\"text\":{\"type\":\"string\"}}", "[\"text\"]");
    k3c_env_tool(&e->tools, "todo_done", "Mark a to-do done today", "{\"id\":{\"type\":\"integer\"}}", "[\"id\"]");
    k3c_env_tool(&e->tools, "note_write", "Save a note under a key",
                 "{\"key\":{\"type\":\"string\"},\"text\":{\"type\":"
                 "\"string\"}}",
                 "[\"key\",\"text\"]");
    k3c_env_tool(&e->tools, "note_read", "Read all notes", "{}", "[]");
    k3c_env_tool(&e->tools, "advance_clock", "End today and go to the next day", "{}", "[]");
    return K3C_OK;
}

static int step(k3c_env *e, const char *tool, const k3c_json *args, k3c_sbuf *obs, k3c_err *err) {
    asst *a = e->st;
    int64_t day = 0, hour = 0, id = 0;
    const char *text = NULL, *key = NULL;
    int rc = K3C_OK;
    if (!strcmp(tool, "calendar_add")) {
        if ((rc = k3c_env_arg_int(args, "day", 1, &day, err)) || (rc = k3c_env_arg_int(args, "hour", 1, &hour, err)) ||
            (rc = k3c_env_arg_str(args, "title", 1, &text, err)))
            return rc;
        if (day < a->today || day > a->days)
            return k3c_errf(err, K3C_EINVAL, "day %lld is not in %d..%d", (long long)day, a->today, a->days);
        if (hour < 0 || hour > 23) return k3c_errf(err, K3C_EINVAL, "hour %lld is not in 0..23", (long long)hour);
        if (a->nev == MAX_EVENTS) return k3c_errf(err, K3C_EINVAL, "the calendar is full");
        event *v = &a->ev[a->nev++];
        *v = (event){(int)day, (int)hour, 1, ""};
        snprintf(v->title, sizeof v->title, "%s", text);
        k3c_sbuf_printf(obs, "event %d added: day %d %02d:00 %s", a->nev, v->day, v->hour, v->title);
    } else if (!strcmp(tool, "calendar_remove")) {
        if ((rc = k3c_env_arg_int(args, "id", 1, &id, err))) return rc;
        if (id < 1 || id > a->nev || !a->ev[id - 1].active)
            return k3c_errf(err, K3C_EINVAL, "no event %lld", (long long)id);
        a->ev[id - 1].active = 0;
        k3c_sbuf_printf(obs, "event %lld removed", (long long)id);
    } else if (!strcmp(tool, "calendar_list")) {
        for (int i = 0; i < a->nev; i++)
            if (a->ev[i].active)
                k3c_sbuf_printf(obs, "%d: day %d %02d:00 %s\n", i + 1, a->ev[i].day, a->ev[i].hour, a->ev[i].title);
        if (!obs->len) k3c_sbuf_printf(obs, "%s", "no events");
    } else if (!strcmp(tool, "todo_add")) {
        if ((rc = k3c_env_arg_str(args, "text", 1, &text, err))) return rc;
        if (a->ntd == MAX_TODOS) return k3c_errf(err, K3C_EINVAL, "too many to-dos");
        snprintf(a->td[a->ntd++].text, sizeof a->td[0].text, "%s", text);
        k3c_sbuf_printf(obs, "to-do %d added", a->ntd);
    } else if (!strcmp(tool, "todo_done")) {
        if ((rc = k3c_env_arg_int(args, "id", 1, &id, err))) return rc;
        if (id < 1 || id > a->ntd) return k3c_errf(err, K3C_EINVAL, "no to-do %lld", (long long)id);
        if (!a->td[id - 1].done_day) a->td[id - 1].done_day = a->today;
        k3c_sbuf_printf(obs, "to-do %lld done on day %d", (long long)id, a->td[id - 1].done_day);
    } else if (!strcmp(tool, "note_write")) {
        if ((rc = k3c_env_arg_str(args, "key", 1, &key, err)) || (rc = k3c_env_arg_str(args, "text", 1, &text, err)))
            return rc;
        int i = 0;
        while (i < a->nnt && strcmp(a->nt[i].key, key)) i++;
        if (i == MAX_NOTES) return k3c_errf(err, K3C_EINVAL, "too many notes");
        if (i == a->nnt) a->nnt++;
        snprintf(a->nt[i].key, sizeof a->nt[i].key, "%s", key);
        snprintf(a->nt[i].text, sizeof a->nt[i].text, "%s", text);
        k3c_sbuf_printf(obs, "note '%s' saved", a->nt[i].key);
    } else if (!strcmp(tool, "note_read")) {
        for (int i = 0; i < a->nnt; i++) k3c_sbuf_printf(obs, "%s: %s\n", a->nt[i].key, a->nt[i].text);
        if (!obs->len) k3c_sbuf_printf(obs, "%s", "no notes");
    } else if (!strcmp(tool, "advance_clock")) {
        a->today++;
        if (a->today > a->days) {
            e->done = 1;
            k3c_sbuf_printf(obs, "%s", "The simulation is over.");
        } else {
            day_message(a, a->today, obs);
        }
    } else {
        return k3c_errf(err, K3C_EINVAL, "unknown tool \"%s\"", tool);
    }
    return K3C_OK;
}

static const event *find_event(const asst *a, const char *title) {
    for (int i = 0; i < a->nev; i++)
        if (a->ev[i].active && !strcmp(a->ev[i].title, title)) return &a->ev[i];
    return NULL;
}

static void score(k3c_env *e, const char *final, k3c_reward *out) {
    asst *a = e->st;
    const event *r1 = find_event(a, a->title1), *r2 = find_event(a, a->title2);
    double req =
        ((r1 && r1->day == a->d1) + (r2 && r2->day >= a->lo && r2->day <= a->hi && r2->day != a->day_off)) / 2.0;
    int active = 0, pref = 0, clash = 0;
    for (int i = 0; i < a->nev; i++) {
        if (!a->ev[i].active) continue;
        active++;
        pref += pref_ok(a, a->ev[i].hour) && a->ev[i].day != a->day_off;
        clash += a->ev[i].day == a->day_off;
        for (int j = 0; j < i; j++)
            clash += a->ev[j].active && a->ev[j].day == a->ev[i].day && a->ev[j].hour == a->ev[i].hour;
    }
    int on_time = 0;
    for (int i = 0; i < a->ntd; i++) on_time |= !strcmp(a->td[i].text, a->todo_text) && a->td[i].done_day == a->dt;
    int mem_pref = 0, mem_off = 0;
    char off[16];
    snprintf(off, sizeof off, "%d", a->day_off);
    for (int i = 0; i < a->nnt; i++) {
        mem_pref |= strstr(a->nt[i].text, a->morning ? "morning" : "afternoon") != NULL;
        mem_off |= strstr(a->nt[i].text, off) && strstr(a->nt[i].text, "off");
    }
    k3c_reward_add(out, "requests", req, 2);
    k3c_reward_add(out, "preferences", active ? (double)pref / active : 0, 1);
    k3c_reward_add(out, "on_time", on_time, 1);
    k3c_reward_add(out, "memory", (mem_pref + mem_off) / 2.0, 1);
    k3c_reward_add(out, "consistency", active && !clash, 1);
    k3c_reward_add(out, "finished", e->done, 1);
    snprintf(out->info, sizeof out->info, "day %d/%d, %d events, %d clashes, to-do on day %d: %s", a->today, a->days,
             active, clash, a->dt, on_time ? "yes" : "no");
    (void) final;
}

static void free_state(k3c_env *e) { free(e->st); }

/* ---------------------------------------------------------------- the expert, played against a fresh copy */

static void call(k3c_env *e, k3c_sbuf *m, const char *tool, const char *args) {
    char *obs = NULL;
    k3c_env_step(e, tool, args, &obs, NULL);
    k3c_sbuf_append(m, m->len > 1 ? "," : "", m->len > 1);
    k3c_sbuf_printf(m, "%s",
                    "{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"type\":\"function\",\"function\":{"
                    "\"name\":");
    k3c_sbuf_json_string(m, tool, strlen(tool));
    k3c_sbuf_printf(m, "%s", ",\"arguments\":");
    k3c_sbuf_json_string(m, args, strlen(args));
    k3c_sbuf_printf(m, "%s", "}}]},{\"role\":\"tool\",\"content\":");
    k3c_sbuf_json_string(m, obs ? obs : "", obs ? strlen(obs) : 0);
    k3c_sbuf_printf(m, "%s", "}");
    free(obs);
}

static int reference(k3c_env *e0, k3c_sbuf *m, k3c_err *err) {
    k3c_env *e;
    int rc = k3c_env_new(e0->kind->name, e0->seed, e0->split, e0->index, &e, err);
    if (rc) return rc;
    asst *a = e->st;
    char args[256];
    k3c_sbuf_printf(m, "%s", "[");
    snprintf(args, sizeof args, "{\"key\":\"preferences\",\"text\":\"appointments in the %s\"}",
             a->morning ? "morning" : "afternoon");
    call(e, m, "note_write", args);
    snprintf(args, sizeof args, "{\"day\":%d,\"hour\":%d,\"title\":\"%s\"}", a->d1, pref_lo(a), a->title1);
    call(e, m, "calendar_add", args);
    call(e, m, "advance_clock", "{}");
    snprintf(args, sizeof args, "{\"key\":\"day_off\",\"text\":\"day %d off\"}", a->day_off);
    call(e, m, "note_write", args);
    snprintf(args, sizeof args, "{\"text\":\"%s\"}", a->todo_text);
    call(e, m, "todo_add", args);
    for (int d = 2; d <= a->days; d++) {
        if (d == a->dt) call(e, m, "todo_done", "{\"id\":1}");
        if (d == 3) {
            int day = a->lo == a->day_off ? a->hi : a->lo;
            snprintf(args, sizeof args, "{\"day\":%d,\"hour\":%d,\"title\":\"%s\"}", day, pref_lo(a) + 1, a->title2);
            call(e, m, "calendar_add", args);
        }
        call(e, m, "advance_clock", "{}");
    }
    k3c_sbuf_printf(m, "%s", ",{\"role\":\"assistant\",\"content\":\"All done.\"}]");
    k3c_env_free(e);
    return K3C_OK;
}

const k3c_env_kind k3c_env_assistant = {"assistant", init, step, score, free_state, reference};
