"""The main job, built on the library: :mod:`xmc_tf.job.build` (the Keras
model and optimizer a config describes).  The library half (layers, losses,
samplers, callbacks, :mod:`xmc_tf.models`) never imports this package."""
