"""Training the learned ensemble scheduler (Garrison, DAC'24, §5.2: "we employ proximal policy optimization
(PPO)"; cited in docs/references.md) with stable-baselines3's PPO on the Gymnasium environment
(engine/ensembles/environment.py), and evaluating it against the baselines in the simulator.

Training is the `train` extra (stable-baselines3 on PyTorch, imported here only); the trained actor is
written to ONNX from its weights (engine/ensembles/export.py), so serving runs it with onnxruntime. The
actor is stable-baselines3's default MLP for a MultiBinary action: two Tanh layers of `hidden` units, then
one logit per member (a Bernoulli per member, which is what `LearnedScheduler` samples).

Hyper-parameters (ours; the paper gives none): 1,024 steps per update, minibatches of 256, 10 epochs,
gamma 0.9 (a query's members weigh on the next few queries through the instances' queues, not on the
distant future), learning rate 3e-4, entropy bonus 0.01 (keeps the per-member Bernoullis from collapsing
to a fixed ensemble: randomness is the defense).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from engine.ensembles.environment import EnsembleSchedulingEnv
from engine.ensembles.export import policy_mlp_write
from engine.ensembles.scheduler import EnsembleScheduler, FixedSizeScheduler, FullEnsembleScheduler, LearnedScheduler, RandomEnsembleScheduler
from engine.simulation.ensembles import EnsembleRun, EnsembleScenario, ensemble_simulate

__all__ = ["TRAIN_EXTRA_HINT", "TrainResult", "scheduler_evaluate", "scheduler_train"]

TRAIN_EXTRA_HINT = ("training needs the train extra (stable-baselines3 and PyTorch): `make train-deps`, or "
                    "`.venv/bin/pip install torch stable-baselines3`")


@dataclass(frozen=True)
class TrainResult:
    """What a training run wrote and what it learnt: the policy's reward per query before and after training,
    on the same evaluation episodes (their own seeds, never trained on; the policy samples its Bernoullis as
    the router does), and how far the actor's weights moved (L2 norm of the change over the norm before)."""

    path: Path
    timesteps: int
    seconds: float
    mean_reward_last: float  # mean reward per step over the last rollout
    reward_untrained: float
    reward_trained: float
    weight_change: float


# Evaluation episodes are seeded from here: far from the training seeds, so the comparison is on queries the
# policy never trained on.
EVALUATION_SEED = 10_000


def scheduler_train(scenario: EnsembleScenario, out: str | Path, *, timesteps: int = 100_000, seed: int = 0, routing: str = "garrison",
                    hidden: Sequence[int] = (64, 64), w1: float = 1.0, w2: float | None = None, episode_queries: int = 1024,
                    evaluation_episodes: int = 2, command: str | None = None) -> TrainResult:
    """Train PPO on `scenario` for `timesteps` queries and write the actor to `out` (.onnx and .json). `w2`
    defaults to the largest query size: one timeout among the last T queries then outweighs any query's
    size in (B - w2 x N), which keeps violations near 1 % where w2 = 1 to 16 let them reach 4-21 % (measured
    on table1-a at load 1.2). The untrained and the trained policy are both evaluated on
    `evaluation_episodes` episodes of their own (`TrainResult`), so that a run shows what training changed."""
    try:
        import torch
        from stable_baselines3 import PPO
        from stable_baselines3.common.callbacks import BaseCallback
    except ImportError as exc:  # the extra is not installed
        raise RuntimeError(TRAIN_EXTRA_HINT) from exc
    if timesteps < 1:
        raise ValueError(f"timesteps must be >= 1, got {timesteps}")
    torch.set_num_threads(1)  # a tiny MLP: threads cost more than they save
    w2 = float(scenario.spec().max_size) if w2 is None else float(w2)
    env = EnsembleSchedulingEnv(scenario, routing=routing, episode_queries=episode_queries, w1=w1, w2=w2)
    rewards: list[float] = []

    class _Rewards(BaseCallback):
        def _on_step(self) -> bool:
            rewards.append(float(np.mean(self.locals["rewards"])))
            return True

    model = PPO("MlpPolicy", env, n_steps=1024, batch_size=256, n_epochs=10, gamma=0.9, learning_rate=3e-4, ent_coef=0.01, seed=seed,
                device="cpu", verbose=0, policy_kwargs={"net_arch": {"pi": list(hidden), "vf": list(hidden)}, "activation_fn": torch.nn.Tanh})
    evaluation = EnsembleSchedulingEnv(scenario, routing=routing, episode_queries=episode_queries, w1=w1, w2=w2)
    before = [(w.copy(), b.copy()) for w, b in _actor_layers(model)]  # copies: the arrays share the live tensors' memory
    reward_untrained = _policy_reward(model, evaluation, evaluation_episodes)
    started = time.perf_counter()
    model.learn(total_timesteps=int(timesteps), callback=_Rewards())
    seconds = time.perf_counter() - started
    layers = _actor_layers(model)
    reward_trained = _policy_reward(model, evaluation, evaluation_episodes)
    change = math.sqrt(sum(float(np.sum((w - w0) ** 2) + np.sum((b - b0) ** 2)) for (w, b), (w0, b0) in zip(layers, before)))
    norm = math.sqrt(sum(float(np.sum(w0 ** 2) + np.sum(b0 ** 2)) for w0, b0 in before))
    meta: dict[str, Any] = {"scenario": scenario.name, "routing": routing, "timesteps": int(timesteps), "seed": seed, "hidden": list(hidden),
                            "reward": {"w1": w1, "w2": w2}, "algorithm": "PPO (stable-baselines3)", "train_seconds": round(seconds, 1),
                            "evaluation": {"episodes": evaluation_episodes, "queries_each": episode_queries, "seed": EVALUATION_SEED,
                                           "reward_per_query_untrained": reward_untrained, "reward_per_query_trained": reward_trained,
                                           "actor_weight_change": change / norm}}
    if command:
        meta["command"] = command
    path = policy_mlp_write(out, layers, env.scheduler_spec, activation="tanh", meta=meta)
    _check_export(model, path, env)
    last = rewards[-1024:]
    return TrainResult(path, int(timesteps), seconds, float(np.mean(last)) if last else float("nan"), reward_untrained, reward_trained,
                       change / norm)


def _policy_reward(model: Any, env: EnsembleSchedulingEnv, episodes: int) -> float:
    """The mean reward per query of `model`'s policy over `episodes` episodes seeded from EVALUATION_SEED, its
    actions sampled (as served) from a generator seeded per episode, so two policies meet the same queries."""
    import torch

    total, steps = 0.0, 0
    for episode in range(episodes):
        torch.manual_seed(EVALUATION_SEED + episode)
        observation, _ = env.reset(seed=EVALUATION_SEED + episode)
        done = False
        while not done:
            action, _ = model.predict(observation, deterministic=False)
            observation, reward, terminated, truncated, _ = env.step(action)
            total, steps = total + float(reward), steps + 1
            done = terminated or truncated
    return total / steps if steps else float("nan")


def _actor_layers(model: Any) -> list[tuple[np.ndarray, np.ndarray]]:
    """The actor's Linear layers in order: the policy MLP's, then the action head."""
    import torch

    linears = [m for m in model.policy.mlp_extractor.policy_net if isinstance(m, torch.nn.Linear)] + [model.policy.action_net]
    return [(m.weight.detach().cpu().numpy(), m.bias.detach().cpu().numpy()) for m in linears]


def _check_export(model: Any, path: Path, env: EnsembleSchedulingEnv) -> None:
    """The ONNX file gives the torch policy's logits (same weights, same arithmetic, up to float rounding)."""
    import onnxruntime as ort
    import torch

    observation, _ = env.reset(seed=123)
    with torch.no_grad():
        tensor = torch.as_tensor(observation).reshape(1, -1)
        expected = model.policy.get_distribution(tensor).distribution.logits.cpu().numpy()
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (got,) = session.run(["logits"], {"features": observation.reshape(1, -1)})
    if not np.allclose(got, expected, atol=1e-4):
        raise RuntimeError(f"the exported policy disagrees with the trained one: {got} vs {expected}")


def scheduler_evaluate(scenario: EnsembleScenario, *, policy_path: str | Path | None = None, routing: str = "garrison",
                       seeds: Sequence[int] = (1,), fixed_sizes: Sequence[int] = ()) -> list[EnsembleRun]:
    """The learned policy (when given) beside the baselines on `scenario`: the full ensemble, the policy's
    random ensemble and random ensembles of each of `fixed_sizes`; one run per seed each."""
    schedulers: list[EnsembleScheduler] = [FullEnsembleScheduler(scenario.policy), RandomEnsembleScheduler(scenario.policy)]
    schedulers += [FixedSizeScheduler(scenario.policy, k) for k in fixed_sizes]
    if policy_path is not None:
        schedulers.append(LearnedScheduler(policy_path, scenario.policy))
    return [ensemble_simulate(scenario, s, routing=routing, seed=seed) for s in schedulers for seed in seeds]
