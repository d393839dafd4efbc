/* ct_scheduler: validation, PyTorch's initial step, stepping (including the
 * SequentialLR warm-up composition and ReduceLROnPlateau) and state. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "optim/optimizer_device.h"
#include "optim/optimizer_impl.h"
#include "optim/sched_rules.h"

struct ct_scheduler {
  ct_sched_config cfg;
  ct_linear_rule main_lin, warm_lin;
  int has_warmup;
  double base_lr;       /* PyTorch's initial_lr */
  double last_lr;       /* get_last_lr()[0] */
  int64_t last_epoch;   /* the outer scheduler's (SequentialLR's or the only one's) */
  int64_t warm_epoch;   /* the warm-up LinearLR's last_epoch */
  int64_t main_epoch;   /* the main schedule's last_epoch */
  double best;          /* plateau */
  int64_t num_bad_epochs, cooldown_counter;
};

ct_sched_config ct_sched_config_default(ct_sched_kind kind) {
  ct_sched_config c;
  memset(&c, 0, sizeof c);
  c.kind = kind;
  c.gamma = 0.1;
  c.start_factor = 1.0 / 3;
  c.end_factor = 1.0;
  c.total_iters = 5;
  c.warmup_start_factor = 1.0 / 3;
  c.warmup_end_factor = 1.0;
  c.pct_start = 0.3;
  c.anneal_strategy = CT_ANNEAL_COS;
  c.cycle_momentum = 1;
  c.base_momentum = 0.85;
  c.max_momentum = 0.95;
  c.div_factor = 25.;
  c.final_div_factor = 1e4;
  c.mode = CT_PLATEAU_MIN;
  c.factor = 0.1;
  c.patience = 10;
  c.threshold = 1e-4;
  c.threshold_mode = CT_THRESHOLD_REL;
  c.eps = 1e-8;
  return c;
}

static ct_status check_linear(const char *what, const ct_linear_rule *l) {
  if (!(l->start_factor > 0 && l->start_factor <= 1))
    return ct_error(CT_ERR_INVALID_ARG, "scheduler config: %sstart_factor must be in (0, 1], got %g", what,
                    l->start_factor);
  if (!(l->end_factor >= 0 && l->end_factor <= 1))
    return ct_error(CT_ERR_INVALID_ARG, "scheduler config: %send_factor must be in [0, 1], got %g", what,
                    l->end_factor);
  if (l->total_iters <= 0)
    return ct_error(CT_ERR_INVALID_ARG, "scheduler config: %stotal_iters must be > 0, got %lld", what,
                    (long long)l->total_iters);
  return CT_OK;
}

static ct_status check_onecycle(const ct_sched_config *c, ct_optim_kind ok) {
  if (!(c->max_lr > 0)) return ct_error(CT_ERR_INVALID_ARG, "scheduler config: onecycle max_lr must be > 0, got %g", c->max_lr);
  if (c->total_steps <= 0)
    return ct_error(CT_ERR_INVALID_ARG, "scheduler config: onecycle total_steps must be > 0, got %lld",
                    (long long)c->total_steps);
  if (!(c->pct_start >= 0 && c->pct_start <= 1))
    return ct_error(CT_ERR_INVALID_ARG, "scheduler config: onecycle pct_start must be in [0, 1], got %g", c->pct_start);
  if (!(c->div_factor > 0) || !(c->final_div_factor > 0))
    return ct_error(CT_ERR_INVALID_ARG, "scheduler config: onecycle div_factor and final_div_factor must be > 0 (got %g, %g)",
                    c->div_factor, c->final_div_factor);
  if (c->anneal_strategy != CT_ANNEAL_COS && c->anneal_strategy != CT_ANNEAL_LINEAR)
    return ct_error(CT_ERR_INVALID_ARG, "scheduler config: onecycle anneal_strategy %d is not cos(0) or linear(1)",
                    (int)c->anneal_strategy);
  /* PyTorch divides by each phase's length; a phase of length <= 0 would
   * give NaN or a jump, so reject it here with the numbers. */
  double t = (double)c->total_steps, p = c->pct_start;
  double ends[3] = {p * t - 1, c->three_phase ? 2 * p * t - 2 : t - 1, t - 1};
  int nph = c->three_phase ? 3 : 2;
  double prev = 0;
  for (int i = 0; i < nph; i++) {
    if (!(ends[i] > prev))
      return ct_error(CT_ERR_INVALID_ARG,
                      "scheduler config: onecycle phase %d is empty (pct_start %g x total_steps %lld too small or too large)",
                      i + 1, p, (long long)c->total_steps);
    prev = ends[i];
  }
  if (c->cycle_momentum) {
    double hi = ok == CT_OPTIM_SGD ? INFINITY : 1; /* Adam's beta1 must stay below 1 */
    if (!(c->base_momentum >= 0 && c->base_momentum < hi && c->max_momentum >= 0 && c->max_momentum < hi))
      return ct_error(CT_ERR_INVALID_ARG,
                      "scheduler config: onecycle base_momentum %g / max_momentum %g out of range for this optimizer",
                      c->base_momentum, c->max_momentum);
  }
  return CT_OK;
}

static ct_status check_config(const ct_sched_config *c, const ct_optimizer *opt, ct_linear_rule *main_lin,
                              ct_linear_rule *warm_lin) {
  main_lin->start_factor = c->start_factor, main_lin->end_factor = c->end_factor, main_lin->total_iters = c->total_iters;
  warm_lin->start_factor = c->warmup_start_factor, warm_lin->end_factor = c->warmup_end_factor;
  warm_lin->total_iters = c->warmup_total_iters ? c->warmup_total_iters : c->warmup_steps;
  switch (c->kind) {
    case CT_SCHED_CONSTANT: break;
    case CT_SCHED_STEP:
      if (c->step_size <= 0)
        return ct_error(CT_ERR_INVALID_ARG, "scheduler config: step step_size must be > 0, got %lld", (long long)c->step_size);
      if (!isfinite(c->gamma)) return ct_error(CT_ERR_INVALID_ARG, "scheduler config: gamma must be finite");
      break;
    case CT_SCHED_MULTISTEP:
      if (c->n_milestones < 0 || c->n_milestones > CT_SCHED_MAX_MILESTONES)
        return ct_error(CT_ERR_INVALID_ARG, "scheduler config: n_milestones must be in [0, %d], got %d",
                        CT_SCHED_MAX_MILESTONES, c->n_milestones);
      for (int i = 1; i < c->n_milestones; i++)
        if (c->milestones[i] < c->milestones[i - 1])
          return ct_error(CT_ERR_INVALID_ARG, "scheduler config: milestones must be non-decreasing (milestones[%d]=%lld < %lld)",
                          i, (long long)c->milestones[i], (long long)c->milestones[i - 1]);
      if (!isfinite(c->gamma)) return ct_error(CT_ERR_INVALID_ARG, "scheduler config: gamma must be finite");
      break;
    case CT_SCHED_COSINE:
      if (c->t_max <= 0)
        return ct_error(CT_ERR_INVALID_ARG, "scheduler config: cosine t_max must be > 0, got %lld", (long long)c->t_max);
      if (!isfinite(c->eta_min)) return ct_error(CT_ERR_INVALID_ARG, "scheduler config: eta_min must be finite");
      break;
    case CT_SCHED_LINEAR: CT_TRY(check_linear("linear ", main_lin)); break;
    case CT_SCHED_ONECYCLE: CT_TRY(check_onecycle(c, ct_optimizer_kind(opt))); break;
    case CT_SCHED_PLATEAU:
      if (c->mode != CT_PLATEAU_MIN && c->mode != CT_PLATEAU_MAX)
        return ct_error(CT_ERR_INVALID_ARG, "scheduler config: plateau mode %d is not min(0) or max(1)", (int)c->mode);
      if (c->threshold_mode != CT_THRESHOLD_REL && c->threshold_mode != CT_THRESHOLD_ABS)
        return ct_error(CT_ERR_INVALID_ARG, "scheduler config: plateau threshold_mode %d is not rel(0) or abs(1)",
                        (int)c->threshold_mode);
      if (!(c->factor >= 0 && c->factor < 1))
        return ct_error(CT_ERR_INVALID_ARG, "scheduler config: plateau factor must be in [0, 1), got %g", c->factor);
      if (c->patience < 0 || c->cooldown < 0)
        return ct_error(CT_ERR_INVALID_ARG, "scheduler config: plateau patience and cooldown must be >= 0 (got %lld, %lld)",
                        (long long)c->patience, (long long)c->cooldown);
      if (!(c->min_lr >= 0) || !(c->eps >= 0) || !isfinite(c->threshold))
        return ct_error(CT_ERR_INVALID_ARG, "scheduler config: plateau min_lr and eps must be >= 0 and threshold finite");
      break;
    default:
      return ct_error(CT_ERR_INVALID_ARG, "scheduler config: unknown kind %d", (int)c->kind);
  }
  if (c->warmup_steps < 0)
    return ct_error(CT_ERR_INVALID_ARG, "scheduler config: warmup_steps must be >= 0, got %lld", (long long)c->warmup_steps);
  if (c->warmup_steps > 0) {
    if (c->kind == CT_SCHED_ONECYCLE || c->kind == CT_SCHED_PLATEAU)
      return ct_error(CT_ERR_INVALID_ARG, "scheduler config: warmup_steps cannot precede %s (it has its own warm-up / is metric driven)",
                      c->kind == CT_SCHED_ONECYCLE ? "onecycle" : "plateau");
    CT_TRY(check_linear("warmup_", warm_lin));
  }
  return CT_OK;
}

static void set_lr(ct_scheduler *s, ct_optimizer *opt, double lr) {
  ct_optimizer_set_lr(opt, lr);
  s->last_lr = lr;
}

ct_status ct_scheduler_create(const ct_sched_config *cfg, ct_optimizer *opt, ct_scheduler **out) {
  if (!out) return ct_error(CT_ERR_INVALID_ARG, "ct_scheduler_create: out is NULL");
  *out = NULL;
  if (!cfg || !opt) return ct_error(CT_ERR_INVALID_ARG, "ct_scheduler_create: %s is NULL", !cfg ? "cfg" : "opt");
  ct_linear_rule main_lin, warm_lin;
  CT_TRY(check_config(cfg, opt, &main_lin, &warm_lin));
  ct_scheduler *s = calloc(1, sizeof *s);
  if (!s) return ct_error(CT_ERR_OUT_OF_MEMORY, "ct_scheduler_create: out of memory");
  s->cfg = *cfg;
  s->main_lin = main_lin;
  s->warm_lin = warm_lin;
  s->has_warmup = cfg->warmup_steps > 0;
  s->base_lr = ct_optimizer_get_lr(opt);
  s->last_lr = s->base_lr;
  s->best = cfg->mode == CT_PLATEAU_MAX ? -INFINITY : INFINITY;

  switch (cfg->kind) {
    case CT_SCHED_PLATEAU: /* ReduceLROnPlateau has no initial step */
      break;
    case CT_SCHED_ONECYCLE: {
      double lr, mom;
      ct_sched_onecycle(cfg, 0, &lr, &mom);
      s->base_lr = cfg->max_lr / cfg->div_factor;
      if (cfg->cycle_momentum) {
        ct_status st = ct_optimizer_set_momentum(opt, mom);
        if (st != CT_OK) {
          free(s);
          return ct_error_wrap(st, "onecycle momentum cycling");
        }
      }
      set_lr(s, opt, lr);
      break;
    }
    default:
      /* SequentialLR leaves the warm-up at epoch 0 and the main schedule at
       * -1 (its own initial step is undone); without warm-up the main
       * schedule's initial step runs. */
      if (s->has_warmup) {
        s->warm_epoch = 0;
        s->main_epoch = -1;
        set_lr(s, opt, ct_sched_chainable_lr(&(ct_sched_config){.kind = CT_SCHED_LINEAR}, &s->warm_lin, 0,
                                             s->base_lr, s->base_lr));
      } else {
        s->main_epoch = 0;
        set_lr(s, opt, ct_sched_chainable_lr(cfg, &s->main_lin, 0, s->base_lr, s->base_lr));
      }
      break;
  }
  *out = s;
  return CT_OK;
}

void ct_scheduler_destroy(ct_scheduler *s) { free(s); }

ct_sched_kind ct_scheduler_kind(const ct_scheduler *s) { return s->cfg.kind; }

double ct_scheduler_last_lr(const ct_scheduler *s) { return s->last_lr; }

ct_status ct_scheduler_step(ct_scheduler *s, ct_optimizer *opt) {
  if (!s || !opt) return ct_error(CT_ERR_INVALID_ARG, "ct_scheduler_step: %s is NULL", !s ? "scheduler" : "opt");
  const ct_sched_config *c = &s->cfg;
  if (c->kind == CT_SCHED_PLATEAU)
    return ct_error(CT_ERR_INVALID_ARG, "ct_scheduler_step: plateau scheduler needs a metric; use ct_scheduler_step_metric");
  if (c->kind == CT_SCHED_ONECYCLE) {
    int64_t step_num = s->main_epoch + 1;
    if (step_num > c->total_steps)
      return ct_error(CT_ERR_INVALID_ARG, "onecycle scheduler: tried to step %lld times, total_steps is %lld",
                      (long long)(step_num + 1), (long long)c->total_steps);
    double lr, mom;
    ct_sched_onecycle(c, step_num, &lr, &mom);
    if (c->cycle_momentum) CT_TRY(ct_optimizer_set_momentum(opt, mom));
    s->main_epoch = s->last_epoch = step_num;
    set_lr(s, opt, lr);
    return CT_OK;
  }
  double cur = ct_optimizer_get_lr(opt), lr;
  if (!s->has_warmup) {
    s->last_epoch = ++s->main_epoch;
    lr = ct_sched_chainable_lr(c, &s->main_lin, s->main_epoch, cur, s->base_lr);
  } else {
    /* SequentialLR.step(): bisect_right([warmup_steps], epoch) picks the
     * schedule; at the milestone itself the main one is stepped with
     * step(0), i.e. its closed form at epoch 0. */
    s->last_epoch++;
    if (s->last_epoch < c->warmup_steps) {
      s->warm_epoch++;
      lr = ct_sched_chainable_lr(&(ct_sched_config){.kind = CT_SCHED_LINEAR}, &s->warm_lin, s->warm_epoch, cur,
                                 s->base_lr);
    } else if (s->last_epoch == c->warmup_steps) {
      s->main_epoch = 0;
      lr = ct_sched_closed_form_lr(c, &s->main_lin, 0, s->base_lr);
    } else {
      s->main_epoch++;
      lr = ct_sched_chainable_lr(c, &s->main_lin, s->main_epoch, cur, s->base_lr);
    }
  }
  set_lr(s, opt, lr);
  return CT_OK;
}

static int is_better(const ct_sched_config *c, double a, double best) {
  if (c->mode == CT_PLATEAU_MIN && c->threshold_mode == CT_THRESHOLD_REL) return a < best * (1. - c->threshold);
  if (c->mode == CT_PLATEAU_MIN) return a < best - c->threshold;
  if (c->threshold_mode == CT_THRESHOLD_REL) return a > best * (c->threshold + 1.);
  return a > best + c->threshold;
}

ct_status ct_scheduler_peek(const ct_scheduler *s, const ct_optimizer *opt, int ahead, ct_optimizer *out) {
  ct_scheduler c = *s;
  *out = *opt;
  for (int i = 0; i < ahead; i++) CT_TRY(ct_scheduler_step(&c, out));
  return CT_OK;
}

ct_status ct_scheduler_step_metric(ct_scheduler *s, ct_optimizer *opt, double metric) {
  if (!s || !opt) return ct_error(CT_ERR_INVALID_ARG, "ct_scheduler_step_metric: %s is NULL", !s ? "scheduler" : "opt");
  const ct_sched_config *c = &s->cfg;
  if (c->kind != CT_SCHED_PLATEAU)
    return ct_error(CT_ERR_INVALID_ARG, "ct_scheduler_step_metric: only plateau schedulers take a metric; use ct_scheduler_step");
  if (isnan(metric)) return ct_error(CT_ERR_INVALID_ARG, "plateau scheduler: metric is NaN at epoch %lld", (long long)(s->last_epoch + 1));
  s->last_epoch++;
  if (is_better(c, metric, s->best)) {
    s->best = metric;
    s->num_bad_epochs = 0;
  } else {
    s->num_bad_epochs++;
  }
  if (s->cooldown_counter > 0) {
    s->cooldown_counter--;
    s->num_bad_epochs = 0; /* bad epochs during cooldown do not count */
  }
  if (s->num_bad_epochs > c->patience) {
    double old_lr = ct_optimizer_get_lr(opt);
    double new_lr = old_lr * c->factor;
    if (new_lr < c->min_lr) new_lr = c->min_lr;
    if (old_lr - new_lr > c->eps) ct_optimizer_set_lr(opt, new_lr);
    s->cooldown_counter = c->cooldown;
    s->num_bad_epochs = 0;
  }
  s->last_lr = ct_optimizer_get_lr(opt);
  return CT_OK;
}

enum { ST_LAST_EPOCH, ST_BASE_LR, ST_LAST_LR, ST_WARM_EPOCH, ST_MAIN_EPOCH, ST_BEST, ST_BAD, ST_COOLDOWN, ST_COUNT };
static const char *const state_names[ST_COUNT] = {"last_epoch",      "base_lr", "last_lr",        "warmup_last_epoch",
                                                  "main_last_epoch", "best",    "num_bad_epochs", "cooldown_counter"};

size_t ct_scheduler_state_count(const ct_scheduler *s) {
  (void)s;
  return ST_COUNT;
}

ct_status ct_scheduler_state(const ct_scheduler *s, size_t i, const char **name, double *value) {
  if (i >= ST_COUNT) return ct_error(CT_ERR_NOT_FOUND, "scheduler: state index %zu out of range (it has %d)", i, ST_COUNT);
  double v = 0;
  switch (i) {
    case ST_LAST_EPOCH: v = (double)s->last_epoch; break;
    case ST_BASE_LR: v = s->base_lr; break;
    case ST_LAST_LR: v = s->last_lr; break;
    case ST_WARM_EPOCH: v = (double)s->warm_epoch; break;
    case ST_MAIN_EPOCH: v = (double)s->main_epoch; break;
    case ST_BEST: v = s->best; break;
    case ST_BAD: v = (double)s->num_bad_epochs; break;
    default: v = (double)s->cooldown_counter; break;
  }
  if (name) *name = state_names[i];
  if (value) *value = v;
  return CT_OK;
}

ct_status ct_scheduler_set_state(ct_scheduler *s, const char *name, double value) {
  if (!name) return ct_error(CT_ERR_INVALID_ARG, "ct_scheduler_set_state: name is NULL");
  int i = 0;
  while (i < ST_COUNT && strcmp(state_names[i], name) != 0) i++;
  if (i == ST_COUNT) return ct_error(CT_ERR_NOT_FOUND, "scheduler: no state named '%s'", name);
  if (i == ST_BASE_LR || i == ST_LAST_LR || i == ST_BEST) {
    if (isnan(value) || (i != ST_BEST && !isfinite(value)))
      return ct_error(CT_ERR_INVALID_ARG, "scheduler state '%s': expected a %s number, got %g", name,
                      i == ST_BEST ? "non-NaN" : "finite", value);
    if (i == ST_BASE_LR) s->base_lr = value;
    else if (i == ST_LAST_LR) s->last_lr = value;
    else s->best = value;
    return CT_OK;
  }
  if (!(value == floor(value) && fabs(value) <= 9007199254740992.0))
    return ct_error(CT_ERR_INVALID_ARG, "scheduler state '%s': expected an integer, got %g", name, value);
  int64_t k = (int64_t)value;
  switch (i) {
    case ST_LAST_EPOCH: s->last_epoch = k; break;
    case ST_WARM_EPOCH: s->warm_epoch = k; break;
    case ST_MAIN_EPOCH: s->main_epoch = k; break;
    case ST_BAD: s->num_bad_epochs = k; break;
    default: s->cooldown_counter = k; break;
  }
  return CT_OK;
}
