/*
 * shmlock.pml - the pyshmlock protocol as the C core (csrc/core/) implements it, for SPIN.
 *
 * Each atomic operation of the C code is one step here (an `atomic` block
 * holds exactly one shared-memory operation plus ghost bookkeeping), and is
 * tagged with the same "model:" marker as the operation it mirrors in
 * the C core.  `make verify` prints the C line of every marker, and a test
 * checks that the model and csrc/core/ carry the same set of markers.
 *
 * NP processes each run OPS operations chosen at random (read, write,
 * update, pause-then-resume).  A reaper may SIGKILL one process between any
 * two steps (MAXDEATHS); an operator then resumes the lock, because a dead
 * pauser's pause stays set by design.  With -DTIMEOUTS a sleeping waiter may
 * also time out and withdraw its attempt (shl_cancel).
 *
 * Interleaving semantics = sequential consistency: the model checks the
 * protocol under the seq_cst operations the C code uses for every handshake;
 * it says nothing about weaker orderings (see docs/DESIGN.md).
 *
 * With -DZOMBIE a process dies thread by thread: its keeper's death (the
 * robust mutex marked OWNER_DIED, one waiter woken) may come first, and the
 * process runs on, holds and all, until it is gone; a prober reclaims a
 * slot only once its process is gone (liveness.c), and meanwhile sees it
 * "exiting".  Without ZOMBIE the keeper and the process die in one step.
 *
 * With -DSESSIONS, a process may run an update session (KIND_SESSION:
 * begin, one update call, end, then resume, as an SGLang trainer drives
 * begin_weight_update / update / end / continue), and an expirer may end a
 * session as expired at any moment (its TTL can be anything).
 *
 * With -DOP_ENDER (and SESSIONS) that expirer is an operator's handle
 * (`pyshmlock resume`, `pyshmlock session end`), which owns no slot: its
 * ending names its liveness byte instead, and it may die at any step after
 * taking the ending; an attached process (the adopter: a watchdog or a
 * waiter) then finishes what it left, once that byte is free.
 *
 * Mutants (-DMUTANT_...) inject one protocol bug each; tests/test_verify.py
 * checks that SPIN finds every one of them.
 */

#ifndef NP
#define NP 3
#endif
#ifndef OPS
#define OPS 2
#endif
#ifndef MAXDEATHS
#define MAXDEATHS 1
#endif

/* The state word, bit for bit as in csrc/core/internal.h, with an EPOCH_BITS-bit epoch
 * (C: 13 bits since layout 4).  EPOCH_BITS=1 lets a few claims wrap the epoch around
 * while one reader waits, which 13 bits do after 8,192 claims. */
#ifndef EPOCH_BITS
#define EPOCH_BITS 2
#endif
#define OWNER_MASK 3
#define UPDATE     4
#define GRANTED    8
#define PAUSED     16
#define SLEEPERS   32
#define DRAINERS   64
#define PINNED     128      /* an update session pins the pause */
#define SUSPECT    256      /* the protected data is suspect (the mark) */
#define EPOCH_ONE  512
#define EPOCH_MASK (((1 << EPOCH_BITS) - 1) * EPOCH_ONE)
#define EPOCH(s)   (((s) & EPOCH_MASK) / EPOCH_ONE)
#define OWNER(s)   ((s) & OWNER_MASK)
#define CLAIM_BITS (OWNER_MASK | UPDATE | GRANTED)

/* The safety properties checked at each step.  -DRELEASE_PROPERTY_ONLY
 * (with a recovery that trusts the keeper's death, which breaks them)
 * checks only that a release never clears a claim it does not own: what
 * the release's re-check of the owner guarantees on its own. */
#ifndef RELEASE_PROPERTY_ONLY
#define PROPERTY(x) assert(x)
#else
#define PROPERTY(x) skip
#endif

/* Read admission's gate (try_read): open if not paused and nobody claims. */
#ifndef MUTANT_READ_IGNORES_PAUSE
#define GATE_OPEN(s) (!((s) & PAUSED) && OWNER(s) == 0)
#else
#define GATE_OPEN(s) (OWNER(s) == 0)
#endif

/* Operations per process: OPS, or OPS0/OPS1/OPS2 for each process. */
#ifdef OPS0
#define OPS_OF(p)  (p == 0 -> OPS0 : (p == 1 -> OPS1 : OPS2))
#else
#define OPS_OF(p)  OPS
#endif

#define KIND_NONE   0
#define KIND_READ   1
#define KIND_WRITE  2
#define KIND_UPDATE 3
#define KIND_SESSION 4      /* an update session (SESSIONS only) */

/* What makes resume wait (try_resume's wait_for_pins). */
#if defined(MUTANT_RESUME_IGNORES_UPDATE)
#define RESUME_PINS PINNED
#elif defined(MUTANT_RESUME_IGNORES_SESSION)
#define RESUME_PINS UPDATE
#else
#define RESUME_PINS (UPDATE | PINNED)
#endif

int  st;                    /* the state word */
/* The drain counter.  In C it is 32 bits, and a process only ever compares
 * it with a value it loaded itself (load at DRAIN_SEQ, FUTEX_WAIT while
 * still equal).  So the model keeps, per process, only whether the counter
 * still equals the value that process loaded: a bump clears every flag.
 * That is exactly a counter that never wraps, and it keeps counter values
 * out of the stored states.  (A first model counted mod 4, and SPIN found a
 * false wrap-around: 4 bumps in one window, with 3 processes and a death.
 * C would need 2^32 bumps in one window.) */
bool seq_same[NP];
byte readers[NP];           /* slot.readers */
byte rwait[2 * NP];         /* slot.rwait[parity] at [2 * slot + parity] */
/* The slots' high-water mark (header.slots_hwm): 1 + the highest slot index
 * attached so far.  A process raises it as its first step (attach_slot);
 * every scan loads it once and skips the slots at or above it. */
byte hwm;
/* attach_slot's fetch-max of the slots' high-water mark: one RMW */
#define ATTACH_HWM() atomic { if :: hwm < me + 1 -> hwm = me + 1 :: else fi }
/* scan_limit: one load of the mark, before the slot loads of a scan.  The
 * stale-bound mutant keeps the value it loaded before its claim. */
#ifndef MUTANT_HWM_STALE
#define SCAN_BOUND() atomic { lim = hwm }
#define SCAN_DONE()  lim = 0
#else
#define SCAN_BOUND() skip
#define SCAN_DONE()  skip
#endif

/* Futexes: who sleeps on which word.  FUTEX_WAIT's "value still equal"
 * check and the going to sleep are one atomic step.  Index NP is the
 * operator, which waits like a user but owns no slot. */
#define NW (NP + 1)
bool asleep[NW];
bool on_drain[NW];          /* asleep on drain_seq (else on the state word) */
byte watching[NW];          /* bit q: asleep also on slot q's robust mutex word */
byte polling[NW];           /* bit q: asleep, polling slot q's exiting process */
bool death_woken[NW];
bool finished[NP];
chan sigkill = [0] of { byte };   /* the reaper's SIGKILL, a rendezvous */

/* Liveness.  alive: the process can still run (no SIGKILL yet, or with
 * ZOMBIE, its other threads run on after its keeper died).  owner_died: no
 * keeper holds its mutex any more (OWNER_DIED, or given back free by a
 * prober that found the process exiting) and the slot is not reclaimed
 * yet: a prober that takes the mutex reclaims it once !alive (PROBE_GONE). */
bool alive[NP];
bool owner_died[NP];
bool keeper_dead[NP];       /* its keeper thread exited (for good) */
/* -DCLOSE: the reaper's victim does not die but closes the lock (another
 * thread of it calls shl_close): its slot is freed (pid 0, mutex unlocked,
 * no OWNER_DIED) and the process stops using the lock.  shl_close succeeds
 * only where the C lets it (CLOSABLE): no call of the process on the lock
 * in flight (`outside`: between operations, or an attempt parked between
 * two calls as asyncio parks it), no hold, no owed-reader registration and
 * no claim of it in the state word.  The keeper's unlock wakes one waiter
 * of the mutex word, like the kernel at a death.
 * MUTANT_CLOSE_IN_FLIGHT is the old shl_close: it refused only with a hold,
 * so a call of another thread could be anywhere. */
bool freed[NP];
bool outside[NW];           /* no call of this process on the lock in flight */
#ifndef MUTANT_CLOSE_IN_FLIGHT
#define CLOSABLE(v) (outside[v] && g_hold[v] == KIND_NONE && OWNER(st) != (v) + 1 && \
                     rwait[2 * (v)] == 0 && rwait[2 * (v) + 1] == 0)
#else
#define CLOSABLE(v) (g_hold[v] == KIND_NONE)
#endif
#define UNCLEAN(p) (readers[p] > 0 || rwait[2 * (p)] > 0 || rwait[2 * (p) + 1] > 0)
/* a free slot that probe_slot reclaims: trylock succeeds and it is dirty */
#define FREED_DIRTY(p) (freed[p] && (OWNER(st) == (p) + 1 || UNCLEAN(p)))
bool reclaiming[NP];        /* a prober holds the dead slot's mutex */
byte deaths;

/* Ghost state for the properties. */
byte g_hold[NP];            /* KIND_* this process holds (counts until reclaimed) */
byte g_phases[NP];          /* exclusive phases ended while this reader waited */
bool g_waiting_read[NP];
bool g_pause_seen[NP];      /* a pause happened while this reader waited */
bool g_pausing[NW];         /* paused and not yet resumed (NW: the operator too) */
bool g_stuck_pause;         /* a pause nobody will resume: its process died between
                               pause and resume, or its resume was refused */
/* The data-suspect mark is the state word's SUSPECT bit: set by the CAS
 * that ends what was lost (the reclaim of a granted exclusive hold, an
 * expired session's unpin), after the count of marks is raised; cleared by
 * the CAS that ends what rewrote the data (a completed exclusive release
 * or session, if no mark was counted since it began; a forced resume).
 * Resume refuses while it is set. */
byte marks;                 /* the header's count of marks made */
byte sess_marks;            /* the header's session_marks: the count at its begin */
byte g_sess_half;           /* ghost: g_half_seq when the session began */
/* Update sessions: the header's session token, the count that makes
 * tokens, and (ghost) the token of the session that pins the pause now. */
byte sess_token;
byte sess_count;
byte g_session;
/* Ghost: the protected data is half-written: an update holder died, or a
 * session expired, and no exclusive section has completed since.  No
 * unforced resume may open the gate then (update holds and sessions pin the
 * pause, so resume waits for their end or reclaim). */
bool g_half;
/* Ghost: the same for a write holder that died.  A write hold does not pin
 * the pause, and its death is in no word resume reads, so a writer that
 * dies while a resume decides can be missed; what holds is that no unforced
 * resume that began after the death opens the gate (it reclaims first). */
bool g_half_w;
byte g_half_seq;            /* ghost: half-write events so far */
byte g_claim_admits[NP];    /* reads admitted while this process's claim drained */

#define IS_WATCHER(q, p) (asleep[q] && (watching[q] & (1 << (p))))

inline bump_drain_seq() {
    for (i : 0 .. NP - 1) { seq_same[i] = 0 }
    i = 0
}

inline wake_state() {
    /* FUTEX_WAKE(INT_MAX) on the state word; callers make it a step */
    for (i : 0 .. NW - 1) { if :: asleep[i] && !on_drain[i] -> asleep[i] = 0; watching[i] = 0; polling[i] = 0 :: else fi }
    i = 0
}

inline wake_drain() {
    for (i : 0 .. NW - 1) { if :: asleep[i] && on_drain[i] -> asleep[i] = 0; on_drain[i] = 0; watching[i] = 0; polling[i] = 0 :: else fi }
    i = 0
}

/* [model:WAKE_DRAINERS] CAS DRAINERS off; then bump drain_seq; then
 * FUTEX_WAKE: three steps, as in C (a death may fall between them). */
inline wake_drainers() {
    atomic {
        if
        :: (st & DRAINERS) -> st = st & ~DRAINERS; cleared = 1
        :: else -> cleared = 0
        fi
    }
#ifndef MUTANT_NO_DRAIN_WAKE
    if
    :: cleared -> atomic { bump_drain_seq() }; atomic { wake_drain() }
    :: else
    fi;
#endif
    cleared = 0
}

/* The end of an update session: whoever takes the ending (a CAS of the
 * token word to ENDING_BY(k) or EXPIRING_BY(k), k a slot or the expirer
 * NP) clears PINNED, and only it.  A token word at ENDING_BY/EXPIRING_BY
 * names no session: the next pin overwrites it.
 * The CAS that clears PINNED also leaves the mark: UNPIN_MARK sets it (an
 * expiry, counted before), UNPIN_UNMARK clears it if no mark was counted
 * since the session began (a normal end), UNPIN_KEEP leaves it.  As in C
 * it is a loop: load the word, [model:SESSION_UNMARK] load the count, CAS
 * from the word loaded. */
#define ENDING_BY(k) (32 + (k))
#define EXPIRING_BY(k) (64 + (k))
#define IS_SESSION_TOKEN(t) ((t) > 0 && (t) < 32)
/* An operator's expiry (OP_ENDER): the ending word names the operator's
 * liveness byte and a nonce, never a slot; one per run here, so one value. */
#define OP_EXPIRING 96
#define IS_OP_ENDING(t) ((t) == OP_EXPIRING)
#define UNPIN_MARK   1
#define UNPIN_KEEP   2
#define UNPIN_UNMARK 3
inline unpin(how) {
    do
    :: atomic { us = st };
       if
#ifndef MUTANT_END_CLEARS_ALWAYS
       :: how == UNPIN_UNMARK -> atomic { um = (marks == sess_marks) }
#else
       :: how == UNPIN_UNMARK -> um = 1           /* the bug: marks since its begin too */
#endif
       :: else -> um = 0
       fi;
       atomic {   /* [model:SESSION_UNPIN] */
           if
           :: st == us ->
               assert((st & PINNED) && g_session != 0);   /* only the owner of an ending unpins */
               cleared = (st & SLEEPERS) != 0;
               st = st & ~(PINNED | SLEEPERS); g_session = 0;
               if :: how == UNPIN_MARK -> st = st | SUSPECT
                  :: how == UNPIN_UNMARK && um -> st = st & ~SUSPECT
                  :: else fi;
               /* ghost: a session that completed with no half-write since
                * it began rewrote the data */
               if :: how == UNPIN_UNMARK && g_half_seq == g_sess_half -> g_half = 0; g_half_w = 0
                  :: else fi;
               us = -1
           :: else
           fi
       }
       if :: us == -1 -> break :: else fi
    od;
    us = 0; um = 0;
#ifndef MUTANT_SESSION_END_NO_WAKE
    if :: cleared -> atomic { wake_state() } :: else fi;
#endif
    cleared = 0
}

/* ------------------------------------------------------------ recovery */

/* Exclusive phases end: count them for the readers that wait. */
inline phase_ended() {
    for (i : 0 .. NP - 1) {
        if :: g_waiting_read[i] && g_phases[i] < 3 -> g_phases[i]++ :: else fi   /* 3 = "more than 2" */
    }
    i = 0
}

/* [model:PROBE] trylock slot p: EOWNERDEAD makes us its only prober;
 * [model:PROBE_GONE] then its whole process must be gone before anything
 * is reclaimed (a process whose keeper died runs on: "exiting", the mutex
 * is given back and nothing changes).  The mutant trusts the keeper's
 * death alone, as the core did before liveness.c. */
#if !defined(MUTANT_RECLAIM_ON_KEEPER_DEATH) && !defined(TRUST_KEEPER_DEATH)
#define PROCESS_GONE(p) (!alive[p])
#else
#define PROCESS_GONE(p) 1
#endif
inline probe(p) {
    atomic {
        if
        :: (owner_died[p] || FREED_DIRTY(p)) && !reclaiming[p] && PROCESS_GONE(p) ->
            reclaiming[p] = 1; got = 1
        :: else -> got = 0
        fi
    }
    if
    :: got ->
        /* [model:RECOVER_READS] (the ghost hold ends only with the process:
         * a reclaim beside a live one leaves it, so the checks see it) */
        atomic { readers[p] = 0; if :: g_hold[p] == KIND_READ && !alive[p] -> g_hold[p] = KIND_NONE :: else fi }
        /* [model:RECOVER_OWED] */
        atomic { rwait[2 * p] = 0; rwait[2 * p + 1] = 0 }
        /* [model:RECOVER_MARK] a granted hold's loss is counted, then marked
         * by the CAS that clears the claim (held, not only claimed: C's
         * exclusive_pid names the holder; a claim still draining wrote
         * nothing) */
        atomic {
            if :: OWNER(st) == p + 1 && (st & GRANTED) &&
                  (g_hold[p] == KIND_WRITE || g_hold[p] == KIND_UPDATE) -> marks++; got = 2
               :: else fi
        }
        /* [model:RECOVER_CLAIM] */
        atomic {
            if
            :: OWNER(st) == p + 1 ->
#ifndef MUTANT_RECOVERY_KEEPS_CLAIM
                st = st & ~(CLAIM_BITS | SLEEPERS); g_claim_admits[p] = 0;
#ifndef MUTANT_RECOVER_MARK_LATE
                if :: got == 2 -> st = st | SUSPECT :: else fi;
#endif
                if :: (g_hold[p] == KIND_WRITE || g_hold[p] == KIND_UPDATE) && !alive[p] ->
                      g_hold[p] = KIND_NONE; phase_ended()
                   :: else fi
#else
                skip
#endif
            :: else
            fi
        }
#ifdef MUTANT_RECOVER_MARK_LATE
        /* the bug: the mark after the claim is gone */
        atomic { if :: got == 2 -> st = st | SUSPECT :: else fi };
#endif
        got = 1;
#if defined(SESSIONS) && !defined(MUTANT_RECOVERY_KEEPS_ENDING)
        /* [model:RECOVER_SESSION] an end the dead process took on and did
         * not finish: take the token word back, then finish the unpin
         * (the mark as it was: its end did not get to clear it) */
        atomic {
            if
            :: sess_token == ENDING_BY(p) -> sess_token = 0; got = (st & PINNED) != 0
            :: else -> got = 0
            fi
        }
        if :: got -> unpin(UNPIN_KEEP) :: else fi;
        got = 1;
#endif
        /* [model:RECOVER_WAKE] wake everyone on both words, bits or not */
#ifndef MUTANT_RECLAIM_NO_WAKE
        atomic { st = st & ~(SLEEPERS | DRAINERS) };
        atomic { bump_drain_seq() };
        atomic { wake_state() };
        atomic { wake_drain() };
#endif
        atomic { owner_died[p] = 0; reclaiming[p] = 0 }   /* consistent + unlock */
    :: else
    fi;
    got = 0
}

inline probe_watched() {
    for (k : 0 .. NP - 1) {
        if :: ((watched | polled) & (1 << k)) -> probe(k) :: else fi
    }
    k = 0
}

/* ------------------------------------------------------------- waiting */

/* [model:DEATH_WATCH] watch every other process's robust mutex word
 * (collect_watch_set); `gone` if one already died: probe, do not sleep.
 * As in C, only slots below the high-water mark are looked at, besides the
 * slot the state word names as owner (a process that has not attached yet
 * is not watched). 
 * With CLOSE, as in C: a free slot is watched only if it is dirty or
 * [model:WATCH_OWNER] the state word names it as owner, and its mutex word
 * (no owner) makes `gone` at once. */
#ifndef CLOSE
#define WATCHES(k) 1
#else
/* (A claim naming a free clean slot needs a corrupt state word, which no
 * process of the model writes: close refuses while a claim is ours.  So
 * the last term guards only what the model cannot reach; a mutant without
 * it searched exactly the same states, and was deleted.) */
#define WATCHES(k) (!freed[k] || UNCLEAN(k) || OWNER(st) == (k) + 1)
#endif
/* A watched slot whose keeper is gone: `gone` (probe it now) if its
 * process is gone too or the slot was freed; otherwise it is exiting: not
 * slept on (its mutex word rings no more) but polled (`polled`): the
 * sleeper wakes once that process is gone (C: the exiting poll). */
inline watch_all_others() {
    d_step {   /* a read-only scan; the set is an over-approximation anyway */
        watched = 0; gone = 0; polled = 0;
        for (k : 0 .. NP - 1) {
            if
            :: k != me && WATCHES(k) && (k < hwm || OWNER(st) == k + 1) ->
                if
                :: owner_died[k] && alive[k] -> polled = polled | (1 << k)
                :: else -> watched = watched | (1 << k);
                           if :: owner_died[k] || freed[k] -> gone = 1 :: else fi
                fi
            :: else
            fi
        }
        k = 0
    }
}

/* After a wait, its locals and the value waited on are dead: every caller
 * loads the word afresh.  Resetting them keeps dead values from
 * multiplying the states SPIN must store. */
inline wait_done(value) {
    d_step { armed = 0; watched = 0; polled = 0; gone = 0; changed = 0; value = 0 }
}

/* futex_waitv compares every word of its vector, the watched mutex words
 * too, in the same atomic step: a watched process that died since arming
 * makes the wait return at once. */
inline watched_died() {
    gone = 0;
    for (k : 0 .. NP - 1) {
        if :: (watched & (1 << k)) && (owner_died[k] || freed[k]) -> gone = 1
           :: (polled & (1 << k)) && !alive[k] -> gone = 1
           :: else fi
    }
    k = 0
}

/* shl_wait on the state word with the value `expect`, watching the owner
 * of every other slot that may hold us up (watch_all_others).  Sets
 * `changed` if the word moved first. */
inline wait_state(expect) {
    changed = 0;
    /* [model:WAIT_ARM_SLEEPERS] equal but for the sleeper bits: arm */
    atomic {
        if
        :: ((st ^ expect) & ~(SLEEPERS | DRAINERS)) == 0 ->
#ifndef MUTANT_NO_SLEEPER_BIT
            st = st | SLEEPERS;
#endif
            armed = st
        :: else -> changed = 1
        fi
    }
    watch_all_others();
    if
    :: !changed && gone -> changed = 1; probe_watched()
    :: else
    fi;
    if
    :: !changed ->
        /* [model:FUTEX_WAIT] sleep while the word holds our value */
        atomic {
            watched_died();
            if
            :: !gone && st == armed -> asleep[me] = 1; on_drain[me] = 0; watching[me] = watched;
                                       polling[me] = polled
            :: else -> changed = 1
            fi;
            armed = 0
        }
        if
        :: !changed -> sleep_until_woken()
        :: else
        fi
    :: else
    fi;
    wait_done(expect)
}

/* shl_wait on drain_seq with the value loaded at DRAIN_SEQ, watching every
 * other slot that holds or owes a read. */
/* An attempt between two calls (asyncio: parked until the helper wakes
 * it): with CLOSE, one state in which shl_close may run. */
inline parked() {
#ifdef CLOSE
    outside[me] = 1;
    outside[me] = 0
#else
    skip
#endif
}

inline wait_drain() {
    changed = 0;
    watch_all_others();
    if
    :: gone -> changed = 1; probe_watched()
    :: else ->
        atomic {   /* [model:FUTEX_WAIT] */
            watched_died();
            if
            :: !gone && seq_same[me] -> asleep[me] = 1; on_drain[me] = 1; watching[me] = watched;
                                        polling[me] = polled
            :: else -> changed = 1
            fi;
            seq_same[me] = 0    /* compared: dead from here */
        }
        if :: !changed -> sleep_until_woken() :: else fi
    fi;
    wait_done(s)
}

/* A process that died unreclaimed and that this sleeper does not watch:
 * it attached after the sleeper took its watch set, so no death wake-up
 * reaches the sleeper.  Only the safety net (SAFETY_NET_NS in wait.c: every
 * sleep ends within 100 ms, and the retry watches afresh) covers it.  The
 * net is modelled for this case only: elsewhere a wake-up the design owes
 * must come from its waker, or the search reports it lost. */
#define DIED_UNWATCHED(k) (NP > (k) && owner_died[k] && !alive[k] && \
                           !(watching[me] & (1 << (k))) && !(polling[me] & (1 << (k))))
/* [model:PROBE_EXITING] an exiting process this sleeper polls is gone: the
 * poll's next probe reclaims it (C: the exiting poll, EXITING_POLL_NS). */
#define POLLED_GONE(k) (NP > (k) && (polling[me] & (1 << (k))) && !alive[k])
#define EXITING_GONE (POLLED_GONE(0) || POLLED_GONE(1) || POLLED_GONE(2) || POLLED_GONE(3))
#define UNWATCHED_DEATH (DIED_UNWATCHED(0) || DIED_UNWATCHED(1) || DIED_UNWATCHED(2) || \
                         DIED_UNWATCHED(3))

inline sleep_until_woken() {
    if
    :: !asleep[me]   /* every waker also clears on_drain and watching */
#ifdef TIMEOUTS
    :: atomic { asleep[me] -> asleep[me] = 0; on_drain[me] = 0; watching[me] = 0; polling[me] = 0; timed_out = 1 }
#endif
#ifndef MUTANT_NO_SAFETY_NET
    /* [model:SAFETY_NET] */
    :: atomic { asleep[me] && UNWATCHED_DEATH ->
                asleep[me] = 0; on_drain[me] = 0; watching[me] = 0; polling[me] = 0 }
#endif
    :: atomic { asleep[me] && EXITING_GONE ->
                asleep[me] = 0; on_drain[me] = 0; watching[me] = 0; polling[me] = 0;
                death_woken[me] = 1 }
    fi;
    if
    :: death_woken[me] -> death_woken[me] = 0; probe_watched()
    :: else
    fi
}

/* ---------------------------------------------------------- the attempts */

/* [model:WITHDRAW_OWED] one decrement per parity registered, then wake
 * the drainers */
inline withdraw_owed() {
    if :: registered & 1 -> atomic { rwait[2 * me]-- } :: else fi;
    if :: registered & 2 -> atomic { rwait[2 * me + 1]-- } :: else fi;
    registered = 0; my_epoch = 0;
    wake_drainers()
}

inline acquire_read() {
    registered = 0; timed_out = 0;
    g_waiting_read[me] = 0; g_phases[me] = 0; g_pause_seen[me] = 0;
    do
    :: /* [model:READ_ANNOUNCE] */
       atomic { readers[me]++ }
       /* [model:READ_LOOK] the admission decision, with the checks of every
        * property that must hold at that instant */
       atomic {
           s = st;
           if
           :: GATE_OPEN(s) ||
#if defined(MUTANT_DRAIN_ADMITS_ALL)
              !(s & (PAUSED | GRANTED)) ->     /* the bug: any reader enters a drain */
#elif defined(MUTANT_WRAP_REFUSES)
              /* the bug: enter only a claim of another epoch; after a wrap
               * the claim that waits for us has our epoch again */
              (!(s & (PAUSED | GRANTED)) && registered && EPOCH(s) != my_epoch) ->
#else
              /* enter a draining claim that waits for us (registered under
               * parity (epoch - 1) & 1), or one of a later epoch */
              (!(s & (PAUSED | GRANTED)) && registered &&
               ((registered & (1 << ((EPOCH(s) + 1) % 2))) || EPOCH(s) != my_epoch)) ->
#endif
               admitted = 1;
               PROPERTY(!(st & PAUSED));                      /* no read while paused */
               for (i : 0 .. NP - 1) {                      /* no read beside an exclusive hold */
                   PROPERTY(g_hold[i] != KIND_WRITE && g_hold[i] != KIND_UPDATE)
               }
               i = 0;
               PROPERTY(g_pause_seen[me] || g_phases[me] <= 2);  /* phase-fair bound */
               if :: OWNER(s) > 0 -> g_claim_admits[OWNER(s) - 1]++;
                                     PROPERTY(g_claim_admits[OWNER(s) - 1] < NP)
                  :: else fi;
               g_hold[me] = KIND_READ; g_waiting_read[me] = 0
           :: else -> admitted = 0
           fi
       }
#ifdef MUTANT_HWM_LATE
       ATTACH_HWM();   /* the bug: the slot is covered only after the reader looked */
#endif
       if
       :: admitted ->
           admitted = 0; s = 0;
           if
           :: registered -> withdraw_owed()   /* [model:READ_ADMIT_OWED] */
           :: else
           fi;
           break
       :: else
       fi;
       /* [model:READ_BACKOUT] */
       atomic { readers[me]--; was_last = (readers[me] == 0) }
       if :: was_last -> was_last = 0; wake_drainers() :: else fi;
       if
       :: OWNER(s) > 0 && !registered ->   /* [model:READ_REGISTER] */
           my_epoch = EPOCH(s);
           /* queued from here on: the phase-fair bound counts from this step;
            * a pause still in force now is a pause period of this wait */
           atomic { rwait[2 * me + my_epoch % 2]++; g_waiting_read[me] = 1; g_phases[me] = 0;
                    g_pause_seen[me] = (st & PAUSED) != 0 };
           registered = 1 << (my_epoch % 2)
#if !defined(MUTANT_NO_REQUEUE) && !defined(MUTANT_REQUEUE_MOVES)
       :: OWNER(s) > 0 && registered && (s & GRANTED) && !(registered & (1 << (EPOCH(s) % 2))) ->
           /* [model:READ_REQUEUE] also register under the granted claim's epoch */
           my_epoch = EPOCH(s);
           atomic { rwait[2 * me + my_epoch % 2]++ };
           registered = registered | (1 << (my_epoch % 2))
#endif
#ifdef MUTANT_REQUEUE_MOVES
       /* the bug the model found in the first requeue: move the registration
        * (add the new one, take the old one away) */
       :: OWNER(s) > 0 && registered && (s & GRANTED) && EPOCH(s) != my_epoch ->
           old_epoch = my_epoch; my_epoch = EPOCH(s);
           atomic { rwait[2 * me + my_epoch % 2]++ };
           atomic { rwait[2 * me + old_epoch % 2]--; old_epoch = 0 };
           registered = 1 << (my_epoch % 2);
           wake_drainers()
#endif
       :: else
       fi;
       parked();
       wait_state(s);
       if
       :: timed_out ->   /* shl_cancel */
           if
           :: registered -> withdraw_owed()   /* [model:CANCEL_REGISTERED] */
           :: else
           fi;
           g_waiting_read[me] = 0;
           break
       :: else
       fi
    od
}

inline release_read() {
    /* [model:RELEASE_READ] (a count that is 0 already: SHL_ECORRUPT, nothing
     * changed; only a reclaim beside a live process, which the protocol
     * never makes, can do that) */
    atomic { if :: readers[me] > 0 -> readers[me]--; was_last = (readers[me] == 0)
                :: else -> was_last = 0 fi;
             g_hold[me] = KIND_NONE }
    if :: was_last -> was_last = 0; wake_drainers() :: else fi
}

/* try_exclusive + drain_for_exclusive + the blocking loop; kind WRITE/UPDATE */
inline acquire_excl(kind) {
    claimed = 0; timed_out = 0; granted_now = 0;
    do
    :: !claimed ->
#ifdef MUTANT_HWM_STALE
        atomic { lim = hwm };   /* the bug: the bound is loaded before the claim */
#endif
        atomic { mymarks = marks };   /* [model:CLAIM_MARKS] (255: claimed under a pin) */
        atomic {   /* [model:EXCL_CLAIM] load + CAS, retried: one step when it succeeds */
            s = st; my_half = (g_session != 0 -> 255 : g_half_seq);
            if
            :: OWNER(s) == 0 ->
                st = ((s & ~SLEEPERS) + EPOCH_ONE) & (EPOCH_MASK | SUSPECT | PINNED | PAUSED | DRAINERS | UPDATE | GRANTED | OWNER_MASK);
                st = (st & ~(UPDATE | GRANTED | OWNER_MASK)) | (me + 1);
                if :: kind == KIND_UPDATE -> st = st | UPDATE;
                      if :: (s & PAUSED) -> st = st | GRANTED :: else fi
                   :: else fi;
                claimed = 1; claim_epoch = EPOCH(st); g_claim_admits[me] = 0;
                if :: (s & PINNED) -> mymarks = 255 :: else fi;
                if :: (st & GRANTED) -> granted_now = 1 :: else fi
            :: else -> claimed = 0
            fi
        }
        if :: claimed && (s & SLEEPERS) -> atomic { wake_state() } :: else fi;
        if
        :: claimed && granted_now -> granted_now = 0; break
        :: claimed && !granted_now -> s = 0
        :: else ->
            parked();
            wait_state(s);
            if :: timed_out -> break :: else fi
        fi
    :: claimed ->
        /* [model:DRAIN_SEQ] */
        seq_same[me] = 1;
        /* [model:DRAIN_LOOK] DRAINERS is set only before a sleep (excl_wait):
         * a claim that drains nothing leaves it as it was */
        atomic { s = st };
        drain_armed = 0;
excl_look:
#ifndef RELEASE_PROPERTY_ONLY
        assert(OWNER(s) == me + 1);          /* nobody clears a live claim */
#else
        /* C: SHL_ECORRUPT, the attempt ends (withdrawn, as on a timeout) */
        if :: OWNER(s) != me + 1 -> timed_out = 1; goto excl_cancel :: else fi;
#endif
        if
        :: !(s & GRANTED) ->
            /* [model:SCAN_HWM] the scan's bound, loaded after the claim */
            SCAN_BOUND();
            /* [model:DRAIN_OWED_SCAN] one load per slot below the bound */
            owed = 0;
            for (k : 0 .. NP - 1) {
                if
                :: k < lim -> atomic { owed = owed + rwait[2 * k + (claim_epoch + 1) % 2] }
                :: else
                fi
            }
            k = 0; SCAN_DONE();
            if
#ifndef MUTANT_NO_OWED_WAIT
            :: !(s & PAUSED) && owed > 0 -> owed = 0; goto excl_wait
#endif
            :: else -> owed = 0
            fi;
#ifdef MUTANT_SCAN_BEFORE_GRANT
            /* the bug: count readers first, then grant, and never look again */
            nread = 0;
            for (k : 0 .. NP - 1) { atomic { nread = nread + readers[k] } }
            k = 0;
            if
            :: nread > 0 && !(kind == KIND_UPDATE && (s & PAUSED)) -> goto excl_wait
            :: else
            fi;
#endif
            /* [model:EXCL_GRANT] CAS on the value we decided on */
            atomic {
                if
                :: st == s -> st = st | GRANTED; s = st; cas_ok = 1
                :: else -> cas_ok = 0
                fi
            }
            if :: !cas_ok -> goto excl_next :: else -> cas_ok = 0 fi;
#ifdef MUTANT_SCAN_BEFORE_GRANT
            goto excl_granted;
#endif
            skip
        :: else
        fi;
        /* [model:SCAN_HWM] the bound again, loaded after GRANTED is set */
        SCAN_BOUND();
        /* [model:DRAIN_READER_SCAN] one load per slot below the bound */
        nread = 0;
        for (k : 0 .. NP - 1) {
            if
            :: k < lim -> atomic { nread = nread + readers[k] }
            :: else
            fi
        }
        k = 0; SCAN_DONE();
        if
        :: (kind == KIND_UPDATE && (s & PAUSED)) || nread == 0 -> nread = 0; goto excl_granted
        :: else -> nread = 0
        fi;
excl_wait:
        if
        :: !drain_armed ->
            /* [model:DRAIN_ARM] before the first sleep of this pass; then
             * look and scan again (a reader or owed reader that leaves after
             * the scan sees DRAINERS and bumps drain_seq) */
            atomic { st = st | DRAINERS; s = st };
#ifdef MUTANT_ARM_WITHOUT_RESCAN
            drain_armed = 0     /* sleeps on what the scan before the arm saw */
#else
            drain_armed = 1;
            goto excl_look
#endif
        :: else -> drain_armed = 0
        fi;
        wait_drain();
        if
        :: timed_out ->   /* shl_cancel */
excl_cancel:
            atomic {   /* [model:CANCEL_CLAIM] */
                if
                :: OWNER(st) == me + 1 -> cleared = (st & SLEEPERS) != 0;
                                          st = st & ~(CLAIM_BITS | SLEEPERS)
                :: else -> cleared = 0
                fi
            }
            if :: cleared -> atomic { wake_state() } :: else fi;
            cleared = 0;
            claimed = 0; claim_epoch = 0; g_claim_admits[me] = 0;
            break
        :: else
        fi;
excl_next:
        skip
    od;
    if
    :: !timed_out ->
excl_granted:
        atomic {   /* the hold begins: check mutual exclusion */
            for (i : 0 .. NP - 1) {
                if
                :: i != me -> PROPERTY(g_hold[i] != KIND_WRITE && g_hold[i] != KIND_UPDATE);
                   if :: kind == KIND_WRITE -> PROPERTY(g_hold[i] != KIND_READ)
                      :: else -> PROPERTY(g_hold[i] != KIND_READ || (st & PAUSED))
                   fi
                :: else
                fi
            }
            i = 0;
            g_hold[me] = kind; claimed = 0; claim_epoch = 0; s = 0; seq_same[me] = 0
        }
    :: else
    fi
}

/* do_release_exclusive's loop: load the word; [model:RELEASE_OWNER] it
 * must name our granted claim (else SHL_ECORRUPT: nothing cleared), on
 * every value the CAS compares against; [model:RELEASE_UNMARK] load the
 * count of marks; [model:EXCL_RELEASE] CAS from the word loaded, clearing
 * the claim, and the mark if no mark was counted since our claim (a
 * completed exclusive section rewrote the data).  The mutant checks the
 * owner once, before the loop, as the core did before. */
inline release_excl() {
    atomic { s = st };
    cas_ok = 0;
    do
    :: cas_ok -> break
    :: !cas_ok ->
#ifdef MUTANT_RELEASE_NO_OWNER_RECHECK
        if :: !checked -> checked = 1;           /* the bug: the first value only */
#endif
        if :: !(OWNER(s) == me + 1 && (s & GRANTED)) -> g_hold[me] = KIND_NONE; break
           :: else fi;
#ifdef MUTANT_RELEASE_NO_OWNER_RECHECK
           :: else fi;
#endif
#ifndef MUTANT_RELEASE_CLEARS_ALWAYS
        atomic { mmatch = (mymarks != 255 && marks == mymarks) };
#else
        mmatch = 1;
#endif
        atomic {
            if
            :: st == s ->
                assert(OWNER(st) == me + 1);      /* a release clears only its own claim */
                cleared = (st & SLEEPERS) != 0;
                st = st & ~(CLAIM_BITS | SLEEPERS);
                if :: mmatch -> st = st & ~SUSPECT :: else fi;
                g_hold[me] = KIND_NONE; g_claim_admits[me] = 0;
                /* ghost: a whole update done outside any session, begun
                 * after the last half-write, rewrote the data */
                if :: my_half == g_half_seq -> g_half = 0; g_half_w = 0 :: else fi;
                phase_ended();
                cas_ok = 1
            :: else -> s = st                      /* the failed CAS's reload */
            fi
        }
    od;
    s = 0; mmatch = 0; cas_ok = 0; checked = 0;
    if :: cleared -> atomic { wake_state() } :: else fi;
    cleared = 0
}

inline pause() {
    /* [model:PAUSE_SET] */
    atomic {
        st = st | PAUSED; g_pausing[me] = 1;
        for (i : 0 .. NP - 1) { if :: g_waiting_read[i] -> g_pause_seen[i] = 1 :: else fi }
        i = 0
    }
    wake_drainers()
}

/* resume(force): wait while an update or a session pins the pause; then,
 * unless forced, refuse while the data is suspect (the pause stays: the
 * operator must decide, g_stuck_pause). */
inline resume(force) {
    timed_out = 0;
    do
    :: atomic { s = st; w_at_look = g_half_w }
       if
       :: !(s & PAUSED) -> g_pausing[me] = 0; s = 0; w_at_look = 0; break
       :: (s & PAUSED) && (s & RESUME_PINS) -> parked(); wait_state(s)
       :: (s & PAUSED) && !(s & RESUME_PINS) ->
#ifndef MUTANT_RESUME_NO_WRITER_PROBE
           /* [model:RESUME_PROBE_WRITER] a granted write hold does not pin the
            * pause, but a dead holder must mark the data before the gate
            * opens: probe (reclaim) it; the CAS below then fails if it did */
           if
           :: OWNER(s) > 0 && OWNER(s) != me + 1 && (s & GRANTED) ->
               writer = OWNER(s) - 1; probe(writer); writer = 0
           :: else
           fi;
#endif
           /* [model:RESUME_SUSPECT] the mark is a bit of the word decided on
            * (the mutant reads it apart from the word its CAS compares, as
            * the core did while the mark lived in another word) */
#ifndef MUTANT_RESUME_IGNORES_SUSPECT
#ifndef MUTANT_RESUME_SUSPECT_APART
           cas_ok = (s & SUSPECT) && !force;
#else
           atomic { cas_ok = (st & SUSPECT) && !force };
#endif
#endif
           if
           /* refused: the pause is now the operator's (one step, so that no
            * kill lands between the pauser's end and the ghost's record) */
           :: cas_ok -> atomic { g_stuck_pause = 1; g_pausing[me] = 0; cas_ok = 0; s = 0 }; break
           :: else
           fi;
           atomic {   /* [model:RESUME_CLEAR] the CAS from the word decided on */
               if
#ifndef MUTANT_RESUME_SUSPECT_APART
               :: st == s ->
#else
               :: (st & ~SUSPECT) == (s & ~SUSPECT) ->   /* the mark is not in the word compared */
#endif
                   for (i : 0 .. NP - 1) { PROPERTY(g_hold[i] != KIND_UPDATE) }   /* never mid-update */
                   i = 0;
                   assert(g_session == 0);                /* never inside a session */
                   PROPERTY(force || (!g_half && !w_at_look));   /* never on half-written data */
                   st = st & ~(PAUSED | SLEEPERS);
                   /* [model:RESUME_FORCE_UNMARK] forced: the caller vouches for
                    * the data, this CAS clears the mark (a later one stays) */
                   if :: force -> st = st & ~SUSPECT; g_half = 0; g_half_w = 0 :: else fi;
                   cas_ok = 1; g_pausing[me] = 0
               :: else -> cas_ok = 0
               fi
           }
           if
           :: cas_ok && (s & SLEEPERS) -> atomic { wake_state(); s = 0; cas_ok = 0 }; break
           :: cas_ok && !(s & SLEEPERS) -> s = 0; cas_ok = 0; break
           :: else -> s = 0
           fi
       fi
    od
}

/* ------------------------------------------------------- update sessions */

/* shl_session_begin is: wait until unpinned, take an update hold, then
 * this pin step (sets `again` if another session pinned first: release,
 * wait again), then release the hold.  user_ops strings the steps together
 * around its one acquire_excl call site. */
inline session_pin() {
    atomic { again = (st & PINNED) != 0 };
    if
    :: !again ->
        pause();
        /* the token (and deadline) before PINNED (a release store) */
        atomic { sess_marks = marks; g_sess_half = g_half_seq };
        atomic { sess_count++; mytoken = sess_count; sess_token = mytoken };
        atomic {   /* [model:SESSION_PIN] */
            assert(!(st & PINNED) && g_session == 0);   /* one session at a time */
            st = st | PINNED; g_session = mytoken
        }
    :: else
    fi
}

/* shl_session_end(mytoken): a CAS of the token word from our token to
 * ENDING_BY(me) takes the ending (see unpin), then PINNED is cleared. */
inline session_end() {
    atomic {   /* [model:SESSION_CLAIM_END] */
#ifndef MUTANT_END_IGNORES_TOKEN
        if
        :: (st & PINNED) && sess_token == mytoken -> sess_token = ENDING_BY(me); cas_ok = 1
        :: else -> cas_ok = 0                     /* SHL_ENOSESSION: it expired */
        fi
#else
        /* the bug: end whatever session pins the pause */
        if :: (st & PINNED) -> sess_token = ENDING_BY(me); cas_ok = 1 :: else -> cas_ok = 0 fi
#endif
    }
    if
    :: cas_ok ->
        assert(g_session == mytoken);               /* an end ends its own session only */
        cas_ok = 0;
        unpin(UNPIN_UNMARK)                         /* a completed session rewrote the data */
    :: else
    fi
}

/* ------------------------------------------------------------ processes */


#define RESET_LOCALS \
    kind = 0; s = 0; owed = 0; nread = 0; armed = 0; my_epoch = 0; old_epoch = 0; mytoken = 0; \
    phase = 0; xkind = 0; again = 0; mymarks = 0; my_half = 0; w_at_look = 0; \
    claim_epoch = 0; watched = 0; got = 0; timed_out = 0; gone = 0; changed = 0; admitted = 0; \
    was_last = 0; cas_ok = 0; i = 0; k = 0; lim = 0; polled = 0; mmatch = 0; checked = 0; \
    us = 0; um = 0

/* every local of a user process but `me`: once it is dead or done */
#define FORGET_ALL n = 0; registered = 0; claimed = 0; granted_now = 0; cleared = 0; \
                   drain_armed = 0; RESET_LOCALS

inline user_ops() {
    n = 0;
#ifndef MUTANT_HWM_LATE
    /* [model:ATTACH_HWM] attach_slot raises the mark before the slot can
     * hold any registration (before the first operation) */
    ATTACH_HWM();
#endif
    do
    :: n < OPS_OF(me) ->
        parked();   /* between two operations: nothing in flight */
#ifdef KIND0
        /* a fixed workload: process i runs KIND<i> (KIND_NONE: pause+resume) */
        kind = (me == 0 -> KIND0 : (me == 1 -> KIND1 : KIND2));
#else
        if   /* pick the operation; each inline below has one call site */
#ifdef VICTIM_KIND
        /* splits a search: the process that may die runs this operation */
        :: me == VICTIM -> kind = VICTIM_KIND
        :: me != VICTIM -> if
#endif
        :: kind = KIND_READ
        :: kind = KIND_WRITE
        :: kind = KIND_UPDATE
        :: kind = KIND_NONE     /* pause, then resume */
#ifdef VICTIM_KIND
                           fi
#endif
        fi;
#endif
        if
        :: kind == KIND_READ ->
            acquire_read(); if :: !timed_out -> release_read() :: else fi
        :: kind == KIND_WRITE || kind == KIND_UPDATE || kind == KIND_SESSION ->
            /* A session (SGLang: begin_weight_update, update, end, continue)
             * is phases around the one acquire_excl call site: 1 wait until
             * unpinned, 2 update hold + pin, 3 an update call of the
             * session, 4 end + resume; 0 a plain write/update; 5 done. */
            phase = (kind == KIND_SESSION -> 1 : 0);
            xkind = (kind == KIND_SESSION -> KIND_UPDATE : kind);
            do
            :: phase == 1 ->
                atomic { s = st };
                if
                :: (s & PINNED) -> parked(); wait_state(s); if :: timed_out -> phase = 5 :: else fi
                :: else -> s = 0; phase = 2
                fi
            :: phase == 0 || phase == 2 || phase == 3 ->
                acquire_excl(xkind);
                if
                :: timed_out -> phase = 5
                :: !timed_out && phase == 2 ->
                    session_pin(); release_excl();
                    phase = (again -> 1 : 3); again = 0
                :: !timed_out && phase != 2 ->
                    release_excl(); phase = (phase == 3 -> 4 : 5)
                fi
            :: phase == 4 -> session_end(); resume(0); phase = 5
            :: phase == 5 -> break
            od
        :: kind == KIND_NONE -> pause(); resume(0)
        fi;
        atomic { n++; RESET_LOCALS }
    :: else -> break
    od;
    finished[me] = 1
}

/* The keeper's death: the kernel marks the process's robust mutex
 * OWNER_DIED and wakes exactly one of the processes sleeping on that mutex
 * word, any one of them.  (i, k: the caller's scratch.) */
inline keeper_dies(v) {
    keeper_dead[v] = 1; owner_died[v] = 1;
    k = 0;                                  /* k: how many watch v */
    for (i : 0 .. NW - 1) { if :: IS_WATCHER(i, v) -> k++ :: else fi }
    i = 0;
    do
    :: i < NW && IS_WATCHER(i, v) ->
        asleep[i] = 0; on_drain[i] = 0; watching[i] = 0; polling[i] = 0; death_woken[i] = 1; break
    :: i < NW && IS_WATCHER(i, v) && k > 1 -> k--; i++   /* the kernel picked another */
    :: i < NW && !IS_WATCHER(i, v) -> i++
    :: i >= NW -> break
    od;
    i = 0; k = 0
}

/* SIGKILL, as the victim's own last step: the process is gone; unless its
 * keeper died before (ZOMBIE), the keeper dies in the same step.  A waiter
 * that polls an exiting process notices its end (EXITING_GONE). */
inline die() {
#ifndef CLOSE
    alive[me] = 0; deaths++; seq_same[me] = 0;
#else
    alive[me] = 0; freed[me] = 1; deaths++; seq_same[me] = 0;
#endif
    if :: g_pausing[me] -> g_stuck_pause = 1; g_pausing[me] = 0 :: else fi;
    /* died mid-update, or mid-write: the data may be half-written */
    if :: g_hold[me] == KIND_UPDATE -> g_half = 1; g_half_seq++
       :: g_hold[me] == KIND_WRITE -> g_half_w = 1; g_half_seq++
       :: else fi;
    asleep[me] = 0; on_drain[me] = 0; watching[me] = 0; polling[me] = 0;
#ifndef CLOSE
    if :: !keeper_dead[me] -> keeper_dies(me) :: else fi
#else
    k = 0;                                  /* k: how many watch us */
    for (i : 0 .. NW - 1) { if :: IS_WATCHER(i, me) -> k++ :: else fi }
    i = 0;
    do
    :: i < NW && IS_WATCHER(i, me) ->
        asleep[i] = 0; on_drain[i] = 0; watching[i] = 0; polling[i] = 0; death_woken[i] = 1; break
    :: i < NW && IS_WATCHER(i, me) && k > 1 -> k--; i++   /* the kernel picked another */
    :: i < NW && !IS_WATCHER(i, me) -> i++
    :: i >= NW -> break
    od
#endif
}

proctype user(byte me) {
    int s, armed;
    byte i, k, got, watched, owed, nread, n, kind, lim;
    byte registered;        /* bit p: counted in rwait[2 * me + p] */
    bool changed, timed_out, admitted, was_last, claimed, granted_now, cas_ok, drain_armed;
    bool cleared, gone;
    byte my_epoch, old_epoch, claim_epoch, mytoken, phase, xkind, mymarks, my_half, writer;
    bool w_at_look;
    bool again, mmatch, checked;
    byte polled, um;        /* exiting slots polled; unpin's count test */
    int us;                 /* unpin's word */
#if MAXDEATHS > 0
    /* A death may strike before any step.  The reaper's signal is a
     * rendezvous, so the kill and the death are one atomic step: no state
     * has a process killed but not yet dead. */
    { user_ops() } unless {
        atomic { sigkill?eval(me) -> die(); FORGET_ALL }
    };
#else
    user_ops();
#endif
    /* dead (or done): its locals no longer matter */
    d_step { FORGET_ALL }
end_dead:
    skip
}

/* Sends SIGKILL to one process that has not finished, at any moment, or
 * to none. */
active proctype reaper() {
    byte v, i, k;
end_reaper:
    if
    :: deaths < MAXDEATHS ->
#ifndef ZOMBIE
        atomic {
#ifdef VICTIM
            v = VICTIM;     /* only this process may die */
#else
            select (v : 0 .. NP - 1);
#endif
            if
#ifndef CLOSE
            :: alive[v] && !finished[v] -> sigkill!v
#else
            :: alive[v] && !finished[v] && CLOSABLE(v) -> sigkill!v
#endif
            :: else     /* that one cannot die any more: no kill in this run */
            fi
        };
#else
        atomic {
#ifdef VICTIM
            v = VICTIM;
#else
            select (v : 0 .. NP - 1);
#endif
        };
        if
        /* its keeper first, the process running on (the rest of a group
         * exit, or a keeper that exited alone); then the process, at any
         * later step of it, or never (it finishes its work) */
        :: atomic { alive[v] && !finished[v] && !keeper_dead[v] -> keeper_dies(v) };
end_zombie:
           if
           :: atomic { alive[v] && !finished[v] -> sigkill!v }
           :: skip
           fi
        /* or both at once */
        :: atomic { alive[v] && !finished[v] -> sigkill!v }
        :: skip
        fi;
#endif
        v = 0
    :: skip
    fi
}

/* Resuming after a dead process's pause (or a refused resume) is the
 * operator's decision, made with force (`pyshmlock resume --force`); it is
 * taken only when such a pause is left. */
active proctype operator() {
    int s, us;
    byte i, k, got, watched, polled, um, me, writer;
    bool w_at_look;
    bool changed, timed_out, cas_ok, cleared, gone;
    int armed;
    me = NP;    /* not a slot of the lock: never equal to an owner */
end_operator:
    do
    :: atomic { g_stuck_pause -> g_stuck_pause = 0 }; resume(1)
    od
}

#ifdef SESSIONS
#ifdef OP_ENDER
/* The operator's liveness byte (an OFD write lock, liveness.c): held from
 * before its ending is taken until after its unpin (or its death). */
bool op_alive = 1;
bool op_claimed;            /* it has taken an ending (its death matters from here) */
chan opkill = [0] of { bit };
#define ME_ENDS OP_EXPIRING
#else
#define ME_ENDS EXPIRING_BY(NP)
#endif
/* A session's TTL may pass at any moment: the expirer (session_expire, run
 * by any attached process's watchdog or a waiter, or by an operator's
 * handle: OP_ENDER) may end the session that pins the pause, once: take the
 * ending, mark the data suspect, unpin. */
active proctype expirer() {
    byte i, um;
    int us;
    bool cleared;
    byte t;
    bool pinned_now, cas_ok;
#ifdef OP_ENDER
    /* the operator dies (SIGKILL, its byte freed by the kernel) at any step
     * once it has taken an ending, or never */
    {
#endif
end_expirer:
    do
    /* [model:SESSION_EXPIRE_LOOK] PINNED seen set (the C loads the token
     * next; the guard also waits for a session token, so that an expirer
     * with nothing to do blocks instead of spinning: a spin would hide a
     * deadlock from the search) */
    :: atomic { (st & PINNED) && IS_SESSION_TOKEN(sess_token) -> skip };
       atomic { t = sess_token };                /* [model:SESSION_EXPIRE_TOKEN] */
       if
       :: IS_SESSION_TOKEN(t) ->
           atomic {   /* [model:SESSION_CLAIM_EXPIRE] the token CAS */
               if :: sess_token == t -> sess_token = ME_ENDS; cas_ok = 1
#ifdef OP_ENDER
                     ; op_claimed = 1
#endif
                  :: else -> cas_ok = 0 fi
           }
           if
           :: cas_ok ->
#ifndef MUTANT_EXPIRE_NO_RECHECK
               /* [model:SESSION_EXPIRE_RECHECK] the PINNED seen may have been
                * the last session's, this token a new one not pinned yet:
                * give it back */
               atomic { pinned_now = (st & PINNED) != 0 };
#else
               pinned_now = 1;
#endif
               if
               :: !pinned_now ->
                   atomic { if :: sess_token == ME_ENDS -> sess_token = t :: else fi };
                   cas_ok = 0; t = 0
               :: else ->
                   atomic { marks++ };  /* [model:SESSION_MARK] counted, then marked by the unpin */
                   atomic { g_half = 1; g_half_seq++ };  /* the session did not complete */
#ifndef MUTANT_EXPIRE_MARKS_LATE
                   unpin(UNPIN_MARK);
#else
                   unpin(UNPIN_KEEP);
                   atomic { st = st | SUSPECT };     /* the bug: marked after the unpin */
#endif
#ifdef OP_ENDER
                   atomic { op_alive = 0; op_claimed = 0 };   /* done: its byte is released */
#endif
                   break                             /* one expiry per run */
               fi
           :: else -> t = 0
           fi
       :: else -> t = 0
       fi
    od
#ifdef OP_ENDER
    } unless { atomic { opkill?_ -> op_alive = 0 } };
#endif
end_expirer_done:
    skip
}

#ifdef OP_ENDER
/* Kills the operator once, at any step after it took an ending, or never. */
active proctype op_reaper() {
end_op_reaper:
    if
    :: atomic { op_claimed && op_alive -> opkill!1 }
    :: skip
    fi
}

/* An attached process (session_expire in its watchdog, or in a waiter of
 * resume) finds an operator's ending in the token word.  Once that
 * operator's liveness byte is free (it died, or finished and let go), it
 * takes the ending over: a CAS from the exact word it loaded (ending words
 * are unique: a later operator's ending is never mistaken for this one).
 * If the pause was still pinned when it looked (after the token), that pin
 * is the one the operator owed to clear: it finishes the end (the mark, the
 * unpin).  Either way it then wakes every sleeper of the state word: the
 * operator may have died between its unpin and the wake-up it owed.  It
 * waits (blocks) while there is nothing to adopt. */
active proctype adopter() {
    byte i, um, t;
    int us;
    bool cleared, gone, pinned_now, cas_ok;
end_adopter:
#if defined(MUTANT_OP_ENDING_NEVER_ADOPTED)
    false;                                          /* the bug: nobody adopts */
#elif !defined(MUTANT_ADOPT_IGNORES_LIVENESS)
    atomic { IS_OP_ENDING(sess_token) && !op_alive -> skip };
#else
    atomic { IS_OP_ENDING(sess_token) -> skip };
#endif
    atomic { t = sess_token };                      /* [model:SESSION_ADOPT_TOKEN] */
#ifndef MUTANT_ADOPT_IGNORES_LIVENESS
    atomic { gone = !op_alive };                    /* [model:SESSION_ADOPT_GONE] */
#else
    gone = 1;                                       /* the bug: never asks */
#endif
    atomic { pinned_now = (st & PINNED) != 0 };     /* [model:SESSION_ADOPT_PINNED] */
    if
    :: IS_OP_ENDING(t) && gone ->
        atomic {   /* [model:SESSION_ADOPT_CLAIM] */
            if :: sess_token == t -> sess_token = EXPIRING_BY(NP + 1); cas_ok = 1
               :: else -> cas_ok = 0 fi
        }
        if
        :: cas_ok && pinned_now ->
            atomic { marks++ };                     /* an expiry: counted, then marked */
            atomic { g_half = 1; g_half_seq++ };
            unpin(UNPIN_MARK)
        :: else
        fi;
#ifndef MUTANT_ADOPT_NO_WAKE
        if
        :: cas_ok ->   /* [model:SESSION_ADOPT_WAKE] bits or not */
            atomic { st = st & ~SLEEPERS };
            atomic { wake_state() }
        :: else
        fi
#else
        skip   /* the bug: the wake-up a dead operator owed is never made */
#endif
    :: else
    fi;
end_adopter_done:
    skip
}
#endif
#endif

init {
    byte p;
    atomic {
        for (p : 0 .. NP - 1) { alive[p] = 1 }
        for (p : 0 .. NP - 1) { run user(p) }
    }
}
