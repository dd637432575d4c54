/*
 * gate.c - the pause gate: pause, resume and what keeps resume waiting (an
 * update hold, an update session's pin) or refusing (suspect data, a host
 * lease's agent), and the waits on the gate (wait_resumed, wait_unpinned).
 * Decisions on the state word, like protocol.c's, whose head comment has
 * the protocol; the session steps themselves are session.c's.
 */
#include "internal.h"

/* May a resume open the gate now, from the state word s that showed no pin
 * or update?  A suspect lock stays shut unless forced; a lock under a host
 * lease is the cluster agent's to open (its agent resumes as manager).  The
 * suspect mark is a bit of s itself: the CAS that opens the gate compares
 * the whole word, so a mark made after this look (a reclaimed hold, an
 * expired session: both set it with the CAS that ends them) makes that CAS
 * fail, and the resume decides again. */
static int resume_allowed(shl_lock *h, const shl_waiter *w, uint32_t s)
{
    struct shl_header *hd = h->hdr;
    if (w->flags & SHL_RESUME_FORCE)
        return SHL_OK;   /* the caller vouches for the data: the CAS clears the mark */
    if (s & ST_SUSPECT)  /* [model:RESUME_SUSPECT] */
        return SHL_ESUSPECT;
    if (!(w->flags & SHL_RESUME_MANAGER) &&
        atomic_load_explicit(&hd->lease_deadline_ns, memory_order_relaxed) != 0)
        return SHL_EMANAGED;
    return SHL_OK;
}

/* Wait while an update or a session pins the pause (an expired session is
 * ended on the way).  SHL_OK: nothing pins it (state in *sp). */
static int wait_for_pins(shl_lock *h, shl_waiter *w, uint32_t *sp)
{
    uint32_t s = *sp;
    while ((s & ST_PINNED) && session_expire(h))
        s = atomic_load_explicit(&h->hdr->state, memory_order_seq_cst);
    *sp = s;
    if (s & ST_PINNED) {
        wait_on_state(w, s);
        return SHL_AGAIN;
    }
    int32_t o = owner_index(h, s);
    if (o == -2)
        return SHL_ECORRUPT;
    if (s & ST_UPDATE) {
        if (o == self_slot(h) && excl_is_this_thread(h, w))
            return SHL_EDEADLK;
        wait_on_state(w, s);
        return SHL_AGAIN;
    }
    /* A write hold does not pin the pause, but one whose holder died must
     * mark the data before the gate opens: probe it (a dead owner is
     * reclaimed, which marks and clears the claim), then decide again. */
    if (o >= 0 && o != self_slot(h) && (s & ST_GRANTED) &&
        probe_slot(h, (uint32_t)o) == PROBE_DEAD) { /* [model:RESUME_PROBE_WRITER] */
        *sp = atomic_load_explicit(&h->hdr->state, memory_order_seq_cst);
        return wait_for_pins(h, w, sp);
    }
    return SHL_OK;
}

int try_resume(shl_lock *h, shl_waiter *w)
{
    struct shl_header *hd = h->hdr;
    uint32_t s = atomic_load_explicit(&hd->state, memory_order_seq_cst);
    for (;;) {
        if (!(s & ST_PAUSED))
            return SHL_OK;
        int r = wait_for_pins(h, w, &s);
        if (r == SHL_OK)
            r = resume_allowed(h, w, s);
        if (r != SHL_OK)
            return r;
        uint32_t ns = s & ~(ST_PAUSED | ST_SLEEPERS);
        /* Forced: the caller vouches for the data as it is now; a mark made
         * after this CAS (a writer that dies under the open gate) stays. */
        if (w->flags & SHL_RESUME_FORCE)
            ns &= ~ST_SUSPECT;   /* [model:RESUME_FORCE_UNMARK] */
        if (atomic_compare_exchange_weak_explicit(&hd->state, &s, ns, memory_order_seq_cst,
                                                  memory_order_seq_cst)) /* [model:RESUME_CLEAR] */
            break;
    }
    atomic_store_explicit(&hd->paused_by_pid, 0, memory_order_relaxed);
    if (s & ST_SLEEPERS)
        futex_wake_all(&hd->state);
    return SHL_OK;
}

int try_wait_unpinned(shl_lock *h, shl_waiter *w)
{
    uint32_t s = atomic_load_explicit(&h->hdr->state, memory_order_seq_cst);
    while ((s & ST_PINNED) && session_expire(h))
        s = atomic_load_explicit(&h->hdr->state, memory_order_seq_cst);
    if (!(s & ST_PINNED))
        return SHL_OK;
    wait_on_state(w, s);
    return SHL_AGAIN;
}

int try_wait_resumed(shl_lock *h, shl_waiter *w)
{
    uint32_t s = atomic_load_explicit(&h->hdr->state, memory_order_seq_cst);
    if (!(s & ST_PAUSED))
        return SHL_OK;
    wait_on_state(w, s);
    return SHL_AGAIN;
}

int do_pause(shl_lock *h)
{
    struct shl_header *hd = h->hdr;
    /* relaxed: only the CAS's expected value (the CAS decides, seq_cst) */
    uint32_t s = atomic_load_explicit(&hd->state, memory_order_relaxed);
    for (;;) {
        if (s & ST_PAUSED)
            return 0;
        /* seq_cst: pairs with try_read's increment-then-load; a reader whose
         * load comes later in the total order sees PAUSED. */
        if (atomic_compare_exchange_weak_explicit(&hd->state, &s, s | ST_PAUSED,
                                                  memory_order_seq_cst, memory_order_seq_cst)) /* [model:PAUSE_SET] */
            break;
    }
    atomic_store_explicit(&hd->paused_by_pid, (uint32_t)getpid(), memory_order_relaxed);
    atomic_store_explicit(&hd->paused_at_ns, real_ns(), memory_order_relaxed);
    atomic_fetch_add_explicit(&hd->pause_count, 1, memory_order_relaxed);
    /* An update that waits for readers proceeds under the pause. */
    wake_drainers(h);
    return 1;
}

int shl_pause(shl_lock *h)
{
    RUN_IN_FLIGHT(h, do_pause(h));
}

