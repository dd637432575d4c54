/*
 * lease.c - the host lease (cluster agent; docs/DESIGN.md section 11).
 *
 * A nonzero lease_deadline_ns at the end of the header is a CLOCK_MONOTONIC
 * deadline the agent renews.  One lease watchdog thread per attached
 * process walks the open handles (handles.c) and
 * pauses, with the ordinary pause step, every segment whose deadline has
 * passed; shl_open does the same check; the stale reset (stale.c) keeps a
 * pause while a lease is armed.  Admission and the read fast path never
 * look at the lease: a pause may be taken by any process at any moment, so
 * the protocol and its model are unchanged by it.
 */
#include "internal.h"

#include <signal.h>

/* Host lease watchdog (docs/DESIGN.md, "Beyond one host"): one thread per
 * process, started by the first attachment (open, or a forked child's
 * re-attachment), signals blocked like the keepers.  It walks the open
 * handles (see lease_sweep) and
 * pauses any segment whose host lease has passed.  Wake-ups: every
 * LEASE_POLL_NS while some open segment has a lease armed, every
 * LEASE_IDLE_NS while handles are open but none is armed (to notice one
 * being armed), none while this process has no open handle.  g_wd_mu and
 * g_wd_cv are process-private and reset in a forked child. */
#define LEASE_POLL_NS  (20LL * 1000 * 1000)
#define LEASE_IDLE_NS  (250LL * 1000 * 1000)
static pthread_mutex_t g_wd_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_wd_cv;          /* CLOCK_MONOTONIC; set up by wd_start */
static int g_wd_started;                /* under g_wd_mu; 0 again in a forked child */
static uint64_t g_wd_gen;               /* under g_wd_mu; bumped by wd_kick */

/* Pause h's gate if its host lease has passed.  Returns 1 when a lease is
 * armed.  The caller keeps the mapping alive (an in-flight count, the sweep,
 * or a handle not yet published by shl_open).  This is only a use of the
 * existing pause step (do_pause, the model's PAUSE_SET): a pause may be taken by
 * any process at any moment, so admission, the model and the read fast path
 * are unchanged. */
int lease_check(shl_lock *h)
{
    struct shl_header *hd = h->hdr;
    /* The state word first, then the deadline.  The agent renews the
     * deadline and then resumes the gate (do_lease_set: a seq_cst store,
     * then resume's seq_cst CAS); an acquire load that sees the resumed
     * (open) gate synchronises with that CAS, so the deadline loaded after
     * it is the renewed one, never the passed one from before: no spurious
     * pause right after a renewal.  (Loaded the other way round, the
     * deadline could be the old one and the gate the new, open one.)  Any
     * value is harmless otherwise: the worst a corrupt deadline does is
     * pause (or not pause) the gate, which every process that can write the
     * segment may do anyway. */
    uint32_t s = atomic_load_explicit(&hd->state, memory_order_acquire);
    int64_t d = atomic_load_explicit(&hd->lease_deadline_ns, memory_order_relaxed);
    if (d == 0)
        return 0;
    if (!(s & ST_PAUSED) && mono_ns() >= d) {
        if (do_pause(h) == 1)
            atomic_fetch_add_explicit(&hd->lease_expiries, 1, memory_order_relaxed);
    }
    return 1;
}

/* One open handle, for the sweep: pause it if its lease has passed, and
 * end its update session if that has expired.  1 if a lease is armed. */
static int sweep_one(shl_lock *h, void *arg)
{
    (void)arg;
    int armed = lease_check(h);
    /* An update session past its deadline ends here at the latest (within
     * one LEASE_IDLE_NS of it), whoever else is around. */
    session_expire(h);
    return armed;
}

/*
 * One sweep over the handles open now (handles.c keeps them on a list, and
 * holds its lock while the sweep looks, so close() takes a handle off the
 * list, and unmaps it, only between two sweeps).  The cost follows the
 * locks open now, not the ones ever opened.  Sets *open to their number;
 * returns 1 if some open segment has a lease armed.
 */
static int lease_sweep(int *open)
{
    return handles_sweep(sweep_one, NULL, open);
}

static void *watchdog_main(void *arg)
{
    (void)arg;
    pthread_setname_np(pthread_self(), "pyshmlock-lease");
    pthread_mutex_lock(&g_wd_mu);
    for (;;) {
        uint64_t gen = g_wd_gen;
        pthread_mutex_unlock(&g_wd_mu);
        int open;
        int armed = lease_sweep(&open);
        int64_t next = mono_ns() + (armed ? LEASE_POLL_NS : LEASE_IDLE_NS);
        struct timespec ts;
        ns_to_timespec(next, &ts);
        pthread_mutex_lock(&g_wd_mu);
        /* Nothing open: sleep until an attachment kicks us (wd_kick bumps
         * g_wd_gen after the handle is on the open list, so a handle published
         * after this sweep began is never missed). */
        while (open == 0 && g_wd_gen == gen)
            pthread_cond_wait(&g_wd_cv, &g_wd_mu);
        if (open != 0)
            while (g_wd_gen == gen && pthread_cond_timedwait(&g_wd_cv, &g_wd_mu, &ts) != ETIMEDOUT)
                ;
    }
    return NULL;
}

/* Start this process's watchdog if it is not running.  SHL_OK or SHL_ESYS. */
int wd_start(void)
{
    int r = 0;
    pthread_mutex_lock(&g_wd_mu);
    if (!g_wd_started) {
        pthread_condattr_t ca;
        pthread_attr_t attr;
        pthread_t t;
        sigset_t all, old;
        pthread_condattr_init(&ca);
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        pthread_cond_init(&g_wd_cv, &ca);
        pthread_condattr_destroy(&ca);
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        pthread_attr_setstacksize(&attr, 64 * 1024);
        /* Like a keeper, the watchdog never takes the application's signals. */
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        r = pthread_create(&t, &attr, watchdog_main, NULL);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        pthread_attr_destroy(&attr);
        if (r == 0)
            g_wd_started = 1;
    }
    pthread_mutex_unlock(&g_wd_mu);
    if (r != 0) {
        errno = r;
        return SHL_ESYS;
    }
    return SHL_OK;
}

/* A handle was published or re-attached: sweep now (and leave an untimed
 * sleep).  Cheap: called only on open and on a forked child's re-attach. */
void wd_kick(void)
{
    pthread_mutex_lock(&g_wd_mu);
    g_wd_gen++;
    if (g_wd_started)
        pthread_cond_broadcast(&g_wd_cv);
    pthread_mutex_unlock(&g_wd_mu);
}

/* In a forked child: the parent's watchdog is not here, and it may have
 * held g_wd_mu at fork().  The child's first attachment starts its own. */
void wd_after_fork(void)
{
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    g_wd_mu = fresh;
    g_wd_started = 0;
}

static int do_lease_set(shl_lock *h, int64_t deadline_ns)
{
    atomic_store_explicit(&h->hdr->lease_pid, deadline_ns ? (uint32_t)getpid() : 0,
                          memory_order_relaxed);
    /* seq_cst: a renewal is ordered before the agent's following resume, so
     * a watchdog that sees the resumed gate also sees the renewed deadline. */
    atomic_store_explicit(&h->hdr->lease_deadline_ns, deadline_ns, memory_order_seq_cst);
    return SHL_OK;
}

int shl_lease_set(shl_lock *h, int64_t deadline_ns)
{
    RUN_IN_FLIGHT(h, do_lease_set(h, deadline_ns));
}

static int do_lease_get(shl_lock *h, shl_lease_info *out)
{
    out->deadline_ns = atomic_load_explicit(&h->hdr->lease_deadline_ns, memory_order_relaxed);
    out->now_ns = mono_ns();
    out->pid = atomic_load_explicit(&h->hdr->lease_pid, memory_order_relaxed);
    out->expiries = atomic_load_explicit(&h->hdr->lease_expiries, memory_order_relaxed);
    return SHL_OK;
}

int shl_lease_get(shl_lock *h, shl_lease_info *out)
{
    RUN_IN_FLIGHT(h, do_lease_get(h, out));
}
