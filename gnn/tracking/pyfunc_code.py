"""The pyfunc model as code, for MLflow's models-from-code: logged as this file, not a pickled object.

MLflow copies this file into the logged model and runs it on load; it names the
model class, whose load_context reads the weights file (gnn.model.checkpoint).
"""

import mlflow

from gnn.tracking.pyfunc import PlansightModel

mlflow.models.set_model(PlansightModel())
